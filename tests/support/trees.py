"""A tree of sub-agents (reference §18) for the tests: ``planner`` hands two tasks to
``researcher``, which hands one to ``checker``, each agent playing its own script (a
``ScriptedModel``'s ``by_system``); and ``settle``, which carries every run of a tree in
this process until none is ready for a worker (no Worker, no sleeps).

``agent()`` (``--agent trees:agent``) is the planner; its default model plays ``PLAN``,
``RESEARCH`` and ``CHECK``. ``model()`` plays other scripts, ``engine()`` is an in-process
engine of the tree on a test's database.
"""

from __future__ import annotations

from typing import Any

import agents
import inprocess

from tether import Agent, Engine, ScriptedModel
from tether.budget import Limits
from tether.runs import Run, RunState

PLANNER, RESEARCHER, CHECKER = "You plan.", "You research.", "You check."

# The planner's one turn: two researchers and a read, then its answer.
PLAN: list[dict[str, Any]] = [
    {
        "tool_calls": [
            agents.call("researcher", task="find A"),
            agents.call("researcher", task="find B"),
            agents.call("lookup", query="plan"),
        ]
    },
    {"content": "planned"},
]
# A researcher's: a checker and a read, then its answer.
RESEARCH: list[dict[str, Any]] = [
    {"tool_calls": [agents.call("checker", task="check it"), agents.call("lookup", query="r")]},
    {"content": "researched"},
]
CHECK: list[dict[str, Any]] = [{"content": "checked"}]
# A researcher that sends (a write a human confirms): its run suspends.
SENDS: list[dict[str, Any]] = [{"tool_calls": [agents.call("send", item="b")]}, {"content": "sent"}]


def model(
    plan: list[dict[str, Any]] = PLAN,
    research: list[dict[str, Any]] = RESEARCH,
    check: list[dict[str, Any]] = CHECK,
) -> ScriptedModel:
    """The scripts of the tree's three agents, each picked by its system prompt."""
    return ScriptedModel(
        plan,
        by_system={RESEARCHER: {"turns": research}, CHECKER: {"turns": check}},
    )


def agent(*, researcher_limits: Limits | dict[str, Any] | None = None) -> Agent:
    """The planner, its researcher (bounded by ``researcher_limits`` apart from the tree)
    and the researcher's checker; every agent of it reads, and the researcher may send."""
    checker = Agent(name="checker", system_prompt=CHECKER, resolve_scope=agents.resolve)
    researcher = Agent(
        name="researcher",
        system_prompt=RESEARCHER,
        tools=(checker.as_tool(), agents.lookup, agents.send),
        resolve_scope=agents.resolve,
    )
    return Agent(
        name="planner",
        system_prompt=PLANNER,
        tools=(researcher.as_tool(limits=researcher_limits), agents.lookup),
        resolve_scope=agents.resolve,
        default_model=model,
    )


def engine(
    url: str,
    script: ScriptedModel | None = None,
    *,
    researcher_limits: Limits | dict[str, Any] | None = None,
    **settings: Any,
) -> Engine:
    """An in-process engine of ``agent(researcher_limits)`` on ``url``, playing ``script``
    (default: ``model()``), with ``settings``."""
    tree = agent(researcher_limits=researcher_limits)
    return inprocess.engine_for(url, tree, script or model(), **settings)


async def settle(engine: Engine, run_id: str) -> dict[str, Run]:
    """Carry every run of ``run_id``'s tree that is ready for a worker, in this process,
    until none is (each run then answered, failed, cancelled, halted, suspended or
    waiting); the tree's runs by id, as stored then."""
    store = engine.runner.store
    while True:
        found = store.tree(run_id)
        ready = [r for r in found if r.state is RunState.RUNNING and r.owner is None]
        if not ready:
            return {r.id: r for r in found}
        for run in ready:
            await engine.run_until_stop(run.id)
