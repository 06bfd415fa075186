"""A tree of sub-agents for ``tether`` processes (``--agent tree_agents:agent``): a lead
that hands two tasks to a helper in one turn, with a read beside them, and a helper whose
one write (``file_note``) lands in the test downstream (``downstream.py``), so a test
counts each child's effect by its idempotency key.

- the lead's turn: ``helper(task="A")``, ``helper(task="B")``, ``lookup(query="x")``;
  then it answers ``LEAD_ANSWER``;
- each helper run: ``file_note(item=NOTE)``, then it answers ``HELPER_ANSWER``.

``file_note`` is not deduplicated downstream: a second execution would be a second row.
It is reconciled by looking its key up, so a recovery finds what a dead worker wrote.
"""

from __future__ import annotations

from typing import Any

import downstream
from agents import call, lookup

from tether import Agent, ScriptedModel, ToolContext, tool

LEAD_PROMPT = "You lead a small team."
HELPER_PROMPT = "You help the lead."
LEAD_ANSWER = "both notes are filed"
HELPER_ANSWER = "note filed"
NOTE = "n"
TASKS = ("A", "B")  # the lead's sub-agent calls, in call order


@tool(effect="write", reconcile=downstream.find)
def file_note(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Write a note downstream, once per key; reconciled by looking the key up."""
    return downstream.apply(ctx, "file_note", item, dedupe=False)


def script() -> ScriptedModel:
    """The lead's turns, and the helper's for the runs with its system message."""
    lead: list[dict[str, Any]] = [
        {
            "tool_calls": [
                *(call("helper", task=task) for task in TASKS),
                call("lookup", query="x"),
            ]
        },
        {"content": LEAD_ANSWER},
    ]
    helper = [{"tool_calls": [call("file_note", item=NOTE)]}, {"content": HELPER_ANSWER}]
    return ScriptedModel(lead, by_system={HELPER_PROMPT: {"turns": helper}})


def helper() -> Agent:
    return Agent(name="helper", system_prompt=HELPER_PROMPT, tools=(file_note,))


def agent() -> Agent:
    """The lead, serving its helper: one ``--agent`` names the whole tree."""
    return Agent(
        name="lead",
        system_prompt=LEAD_PROMPT,
        tools=(helper().as_tool(), lookup),
        default_model=script,
    )
