"""Dry runs (reference §12) through the Python API, on both backends: a dry run never
executes a write. Each write gets the call it would have made as its result, which the
model sees next, and a ``skipped`` ledger entry after its intent; reads execute; a write
that needs confirmation (always or by condition) does not suspend; skipped calls count as
tool calls; a continued dry run is still one; after a crash at ``after_intent`` the write
is skipped, never reconciled."""

from __future__ import annotations

import json
from typing import Any

import agents
import downstream
import inprocess
import pytest
import sqlalchemy as sa
from waiting import until

from tether import (
    Agent,
    Engine,
    MemoryNotifier,
    Outcome,
    ScriptedModel,
    StopKind,
    ToolContext,
    tool,
)
from tether.config import Settings
from tether.errors import FailpointError
from tether.failpoints import clear_failpoints, set_failpoint
from tether.models.base import Message, ModelResponse, ToolSpec
from tether.runs import RunState
from tether.store import CallStatus
from tether.store.sql import schema


class Recording(ScriptedModel):
    """The scripted model, keeping every message list it was asked with."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        super().__init__(turns)
        self.seen: list[list[Message]] = []

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.seen.append([dict(m) for m in messages])
        return await super().request(messages, tools)


def make_dry(engine: Engine, run_id: str) -> None:
    """Mark a waiting run as a dry run, as a dry-run fork is created."""
    with engine.runner.store.engine.begin() as conn:
        conn.execute(sa.update(schema.runs).where(schema.runs.c.id == run_id).values(dry_run=True))


def results(messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


def would(tool_name: str, **arguments: Any) -> dict[str, Any]:
    return {"dry_run": True, "would_call": {"tool": tool_name, "arguments": arguments}}


async def recovered(engine: Engine) -> list[Outcome]:
    """Reaper passes until one recovers something (the orphan's heartbeat must go stale)."""
    return await until(engine.runner.recover_orphans, interval=0.05, what="an orphan recovered")


async def dry_run_of(engine: Engine, question: str = "go", **limits: Any) -> str:
    run = await engine.start_run("dana", question, limits=limits or None)
    make_dry(engine, run.id)
    return run.id


async def test_a_dry_runs_writes_are_skipped_its_reads_run_and_the_model_sees_the_would_call(
    db_url: str,
) -> None:
    model = Recording(agents.SCRIPTS["standard"])
    notifier = MemoryNotifier()
    engine = Engine(
        agent=agents.agent(),
        model=model,
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    try:
        run_id = await dry_run_of(engine)
        outcome = await engine.run_until_stop(run_id)
        # ``send`` needs confirmation, yet nothing suspended: nothing was going to execute.
        assert outcome.kind is StopKind.ANSWERED
        view = await engine.get_run(run_id)
        assert view.run.dry_run is True
        assert results(view.messages) == [
            {"query": "x", "answer": "about x", "pad": ""},
            would("record", item="a"),
            {"query": "y", "answer": "about y", "pad": ""},
            would("send", item="b"),
        ]
        assert downstream.effects() == []
        assert notifier.notices == []
        kinds = [e.kind for e in await engine.events(run_id)]
        assert "suspended" not in kinds and "reconciled" not in kinds
        ledger = {e.tool: e for e in await engine.ledger(run_id)}
        assert ledger["record"].status is CallStatus.SKIPPED
        assert ledger["send"].status is CallStatus.SKIPPED
        assert ledger["send"].outcome_at is not None
        assert ledger["lookup"].status is CallStatus.OK
        # Four calls, all counted: a skipped write is a tool call for the budget.
        assert view.run.budget.tool_calls == 4
        # The model's next request held each skipped write's dry-run result.
        after_record = model.seen[2]
        assert json.loads(after_record[-2]["content"]) == would("record", item="a")
        assert json.loads(model.seen[3][-1]["content"]) == would("send", item="b")
    finally:
        engine.close()


def _large(args: Any, scope: Any) -> bool:
    return bool(args.amount > 1000)


@tool(effect="write", dedupes=True, needs_confirmation=_large)
def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Pay an amount; a human confirms large ones."""
    return downstream.write_effect(ctx, "pay", str(amount))


async def test_a_conditionally_confirmed_write_is_skipped_either_way_without_suspending(
    db_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("pay", amount=10)]},
        {"tool_calls": [agents.call("pay", amount=5000)]},
        {"content": "paid"},
    ]
    agent = Agent(name="payer", system_prompt="Pay.", tools=(pay,), resolve_scope=agents.resolve)
    notifier = MemoryNotifier()
    engine = Engine(
        agent=agent,
        model=ScriptedModel(turns),
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    try:
        run_id = await dry_run_of(engine)
        assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
        view = await engine.get_run(run_id)
        assert results(view.messages) == [would("pay", amount=10), would("pay", amount=5000)]
        assert [e.status for e in await engine.ledger(run_id)] == [CallStatus.SKIPPED] * 2
        assert downstream.effects() == [] and notifier.notices == []
    finally:
        engine.close()


async def test_skipped_writes_spend_the_tool_call_budget_and_a_continued_dry_run_stays_dry(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    try:
        run_id = await dry_run_of(engine, max_tool_calls=2)
        outcome = await engine.run_until_stop(run_id)
        # lookup, then record skipped: the turn's second call (lookup) would be the third.
        assert outcome.kind is StopKind.HALTED and outcome.reason == "max_tool_calls"
        halted = await engine.get_run(run_id)
        assert halted.run.budget.tool_calls == 2
        assert results(halted.messages)[-1] == would("record", item="a")
        continued = await engine.continue_run(run_id, "dana")
        assert continued.dry_run is True
        assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
        view = await engine.get_run(run_id)
        assert view.run.dry_run is True
        assert results(view.messages)[-1] == would("send", item="b")
        assert view.run.budget.tool_calls == 4
        assert downstream.effects() == []
    finally:
        engine.close()


async def test_a_dry_write_left_at_after_intent_is_skipped_by_the_reaper_never_reconciled(
    db_url: str,
) -> None:
    crasher = inprocess.engine(db_url, script_name="write_once")
    try:
        run_id = await dry_run_of(crasher)
        set_failpoint("after_intent", "error", tool="write_once")
        with pytest.raises(FailpointError):
            await crasher.run_until_stop(run_id)
    finally:
        clear_failpoints()
        crasher.close()
    reaper = inprocess.engine(db_url, script_name="write_once", heartbeat_timeout_s=0.2)
    try:
        (entry,) = await reaper.ledger(run_id)
        assert entry.status is CallStatus.INTENT
        outcomes = await recovered(reaper)
        assert [o.run_id for o in outcomes] == [run_id]
        (entry,) = await reaper.ledger(run_id)
        assert entry.status is CallStatus.SKIPPED
        assert "reconciled" not in [e.kind for e in await reaper.events(run_id)]
        assert (await reaper.run_until_stop(run_id)).kind is StopKind.ANSWERED
        view = await reaper.get_run(run_id)
        assert results(view.messages) == [would("write_once", item="w")]
        assert view.run.state is RunState.ANSWERED
        assert downstream.effects() == []
    finally:
        reaper.close()
