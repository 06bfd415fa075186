"""Agents of several versions for the reference §12 tests: the test agent's tools plus ``whoami``, a
read that answers with the version of the code running it, so a run's messages show which
version carried each of its steps. Workers load them as ``--agent versioned:v1`` etc."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import agents

from tether import Agent, Engine, ScriptedModel, ToolContext, tool
from tether.config import Settings
from tether.notify import MemoryNotifier, Notifier

# Each step of a run asks whoami, so every step shows who carried it; the lookup between
# them is the slow read that keeps a run in hand (``downstream.set_world("lookup_ms", ...)``).
TURNS: list[dict[str, Any]] = [
    {"tool_calls": [agents.call("whoami")]},
    {"tool_calls": [agents.call("lookup", query="x")]},
    {"tool_calls": [agents.call("whoami")]},
    {"content": "done"},
]


@tool(effect="read")
def whoami(ctx: ToolContext) -> dict[str, Any]:
    """Which agent version is running this call."""
    return {"served_by": ctx.deps["version"]}


def _agent(version: str, *, with_send: bool = True) -> Agent:
    base = agents.agent()
    tools = (*(t for t in base.tools if with_send or t.name != "send"), whoami)
    return dataclasses.replace(
        base,
        tools=tools,
        version=version,
        deps={"version": version},
        default_model=lambda: ScriptedModel(TURNS),
    )


def v1() -> Agent:
    return _agent("kit@v1")


def v2() -> Agent:
    return _agent("kit@v2")


def v3() -> Agent:
    """A version that dropped ``send`` (the write that needs confirmation)."""
    return _agent("kit@v3", with_send=False)


def engine(
    url: str,
    agent: Agent,
    *,
    turns: list[dict[str, Any]] | None = None,
    notifier: Notifier | None = None,
    **settings: Any,
) -> Engine:
    """An in-process engine for ``agent`` on ``url``."""
    return Engine(
        agent=agent,
        model=ScriptedModel(turns if turns is not None else TURNS),
        settings=Settings(database_url=url, **settings),
        notifier=notifier or MemoryNotifier(),
    )


def served_by(messages: list[dict[str, Any]]) -> list[str]:
    """The versions that answered the run's whoami calls, in order."""
    seen = []
    for message in messages:
        if message.get("role") == "tool" and "served_by" in str(message.get("content")):
            seen.append(json.loads(message["content"])["served_by"])
    return seen
