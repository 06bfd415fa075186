"""Calls of one turn that run together (reference §1, "Several calls in one turn"): a write
declared ``concurrent`` runs beside the reads and concurrent writes next to it; a plain
write runs alone, after the calls before it have ended and before the calls after it
start; every result is stored in call order whatever order the calls ended in; one call
failing discards no other's result; a write that raises is reconciled; a dry run's
concurrent write never runs; after a crash with a group's writes committed and none of
their results stored, each write is reconciled by its key. On both backends.

Overlap is proven with events, not timing: a call that must overlap another waits (with a
deadline) until that one has started, and reports whether it did."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import inprocess
import pytest
import sqlalchemy as sa
from agents import call
from waiting import until

from tether import (
    Agent,
    Engine,
    Reconciled,
    StopKind,
    ToolContext,
    tool,
)
from tether.errors import FailpointError
from tether.failpoints import clear_failpoints, set_failpoint
from tether.runs import RunState
from tether.store import CallStatus
from tether.store.sql import schema

DEADLINE_S = 5.0


class Calls:
    """What the tools did: ``start:LABEL`` / ``end:LABEL`` in the order they happened, an
    event for each, and the writes' effects by idempotency key."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.effects: dict[str, list[str]] = {}
        self._events: dict[str, asyncio.Event] = {}

    def event(self, name: str) -> asyncio.Event:
        return self._events.setdefault(name, asyncio.Event())

    def mark(self, name: str) -> None:
        self.log.append(name)
        self.event(name).set()

    async def work(self, label: str, wait_for: str) -> dict[str, Any]:
        """Start, wait for ``wait_for`` (an event name, "" for none) with a deadline, end."""
        self.mark(f"start:{label}")
        met = True
        if wait_for:
            try:
                await asyncio.wait_for(self.event(wait_for).wait(), timeout=DEADLINE_S)
            except TimeoutError:
                met = False
        self.mark(f"end:{label}")
        return {"name": label, "met": met}

    def find(self, key: str, ctx: ToolContext) -> Reconciled:
        done = self.effects.get(key)
        return Reconciled.found({"name": done[0], "found": True}) if done else Reconciled.absent()


def _agent(calls: Calls) -> Agent:
    @tool
    async def look(label: str, wait_for: str = "") -> dict[str, Any]:
        """A read."""
        return await calls.work(label, wait_for)

    @tool(effect="write", dedupes=True, concurrent=True)
    async def tally(ctx: ToolContext, label: str, wait_for: str = "") -> dict[str, Any]:
        """A write whose effects commute with the others' (the downstream deduplicates:
        a repeated key answers with the first result)."""
        first = calls.effects.get(ctx.idempotency_key)
        if first:
            return {"name": first[0], "deduped": True}
        done = await calls.work(label, wait_for)
        calls.effects.setdefault(ctx.idempotency_key, []).append(label)
        return done

    @tool(effect="write", reconcile=calls.find, concurrent=True)
    async def stamp(ctx: ToolContext, label: str, wait_for: str = "") -> dict[str, Any]:
        """A concurrent write reconciled by its key."""
        done = await calls.work(label, wait_for)
        calls.effects.setdefault(ctx.idempotency_key, []).append(label)
        return done

    @tool(effect="write", dedupes=True)
    async def put(ctx: ToolContext, label: str) -> dict[str, Any]:
        """A plain write: it runs alone."""
        return await calls.work(label, "")

    @tool(effect="write", reconcile=calls.find, concurrent=True)
    async def flaky(ctx: ToolContext, label: str) -> dict[str, Any]:
        """A write with a bug after its effect: it took effect, then raised."""
        calls.effects.setdefault(ctx.idempotency_key, []).append(label)
        raise RuntimeError("a bug after the write")

    @tool(effect="write", reconcile=calls.find)
    async def flaky_alone(ctx: ToolContext, label: str) -> dict[str, Any]:
        """``flaky``, not concurrent."""
        calls.effects.setdefault(ctx.idempotency_key, []).append(label)
        raise RuntimeError("a bug after the write")

    @tool
    async def boom() -> dict[str, Any]:
        """A read with a bug in it."""
        raise RuntimeError("a bug in a read")

    tools = (look, tally, stamp, put, flaky, flaky_alone, boom)
    return Agent(name="concurrent", system_prompt="test", tools=tools)


def _turns(*calls_: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"tool_calls": list(calls_)}, {"content": "done"}]


def _results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


async def _ask(engine: Engine, **kw: Any) -> tuple[Any, Any]:
    try:
        outcome = await engine.ask("dana", "go", **kw)
        return outcome, await engine.get_run(outcome.run_id)
    finally:
        engine.close()


async def test_a_concurrent_write_and_a_read_run_at_the_same_time(db_url: str) -> None:
    calls = Calls()
    turns = _turns(
        call("look", label="r", wait_for="start:w"),
        call("tally", label="w", wait_for="start:r"),
    )
    outcome, view = await _ask(inprocess.engine_for(db_url, _agent(calls), turns))
    assert outcome.kind is StopKind.ANSWERED
    # Each waited until the other had started: both met, so they overlapped.
    assert _results(view.messages) == [{"name": "r", "met": True}, {"name": "w", "met": True}]
    assert len(calls.effects) == 1


async def test_a_plain_write_runs_alone_between_the_calls_around_it(db_url: str) -> None:
    calls = Calls()
    turns = _turns(
        call("look", label="a"),
        call("tally", label="b"),
        call("put", label="p"),
        call("look", label="c"),
        call("tally", label="d"),
    )
    outcome, view = await _ask(inprocess.engine_for(db_url, _agent(calls), turns))
    assert outcome.kind is StopKind.ANSWERED
    assert [r["name"] for r in _results(view.messages)] == ["a", "b", "p", "c", "d"]
    p_start, p_end = calls.log.index("start:p"), calls.log.index("end:p")
    assert p_end == p_start + 1  # nothing started or ended while it ran
    assert {"end:a", "end:b"} <= set(calls.log[:p_start])  # the calls before it had ended
    assert {"start:c", "start:d"} <= set(calls.log[p_end:])  # those after it started later


async def test_results_are_stored_in_call_order_when_a_later_call_ends_first(db_url: str) -> None:
    calls = Calls()
    turns = _turns(
        call("stamp", label="first", wait_for="end:second"),
        call("look", label="second"),
    )
    outcome, view = await _ask(inprocess.engine_for(db_url, _agent(calls), turns))
    assert outcome.kind is StopKind.ANSWERED
    assert calls.log.index("end:second") < calls.log.index("end:first")
    assert [r["name"] for r in _results(view.messages)] == ["first", "second"]
    assert all(r["met"] for r in _results(view.messages))


async def test_a_failing_read_is_a_tool_error_and_the_other_results_are_kept(db_url: str) -> None:
    calls = Calls()
    turns = _turns(call("tally", label="a"), call("boom"), call("look", label="b"))
    engine = inprocess.engine_for(db_url, _agent(calls), turns)
    try:
        outcome = await engine.ask("dana", "go")
        view = await engine.get_run(outcome.run_id)
        ledger = await engine.ledger(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    a, failed, b = _results(view.messages)
    assert a["name"] == "a" and b["name"] == "b"
    assert failed["error"] == "tool_error" and "a bug in a read" in failed["message"]
    assert [e.status for e in ledger] == [CallStatus.OK, CallStatus.ERROR, CallStatus.OK]
    assert view.run.budget.tool_calls == 3


@pytest.mark.parametrize("grouped", [True, False], ids=["in-a-group", "alone"])
async def test_a_write_that_raises_is_reconciled_by_its_key(db_url: str, grouped: bool) -> None:
    calls = Calls()
    write = call("flaky" if grouped else "flaky_alone", label="x")
    turns = _turns(write, call("look", label="y")) if grouped else _turns(write)
    engine = inprocess.engine_for(db_url, _agent(calls), turns)
    try:
        outcome = await engine.ask("dana", "go")
        view = await engine.get_run(outcome.run_id)
        events = await engine.events(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    results = _results(view.messages)
    assert results[0] == {"name": "x", "found": True}  # its outcome, found by key
    assert [e.data["found"] for e in events if e.kind == "reconciled"] == ["found"]
    assert [len(v) for v in calls.effects.values()] == [1]  # never run again
    if grouped:
        assert results[1]["name"] == "y"


async def test_a_dry_runs_concurrent_write_gets_its_would_call_and_never_runs(
    db_url: str,
) -> None:
    calls = Calls()
    engine = inprocess.engine_for(
        db_url, _agent(calls), _turns(call("tally", label="w"), call("look", label="r"))
    )
    try:
        run = await engine.start_run("dana", "go")
        with engine.runner.store.engine.begin() as conn:
            conn.execute(
                sa.update(schema.runs).where(schema.runs.c.id == run.id).values(dry_run=True)
            )
        outcome = await engine.run_until_stop(run.id)
        view = await engine.get_run(run.id)
        ledger = await engine.ledger(run.id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    skipped, read = _results(view.messages)
    assert skipped == {
        "dry_run": True,
        "would_call": {"tool": "tally", "arguments": {"label": "w", "wait_for": ""}},
    }
    assert read["name"] == "r"
    assert [e.status for e in ledger] == [CallStatus.SKIPPED, CallStatus.OK]
    assert calls.effects == {} and "start:w" not in calls.log


async def test_a_group_the_tool_call_budget_could_stop_runs_one_at_a_time(db_url: str) -> None:
    calls = Calls()
    turns = _turns(call("tally", label="a"), call("look", label="b"), call("stamp", label="c"))
    outcome, view = await _ask(
        inprocess.engine_for(db_url, _agent(calls), turns), limits={"max_tool_calls": 2}
    )
    assert outcome.kind is StopKind.HALTED and outcome.reason == "max_tool_calls"
    assert [r["name"] for r in _results(view.messages)] == ["a", "b"]
    assert calls.log == ["start:a", "end:a", "start:b", "end:b"]  # in order, never beside


async def test_after_a_crash_with_a_groups_writes_committed_each_is_reconciled_by_its_key(
    db_url: str,
) -> None:
    calls = Calls()
    turns = _turns(
        call("tally", label="t", wait_for="start:s"),
        call("look", label="r"),
        call("stamp", label="s", wait_for="start:t"),
    )
    crasher = inprocess.engine_for(db_url, _agent(calls), turns)
    try:
        run = await crasher.start_run("dana", "go")
        set_failpoint("after_tool_commit", "error", tool="stamp")
        with pytest.raises(FailpointError):
            await crasher.run_until_stop(run.id)
    finally:
        clear_failpoints()
        crasher.close()
    assert len(calls.effects) == 2  # both writes committed downstream
    reaper = inprocess.engine_for(db_url, _agent(calls), turns, heartbeat_timeout_s=0.2)
    try:
        assert _results((await reaper.get_run(run.id)).messages) == []  # none stored
        await until(reaper.runner.recover_orphans, interval=0.05, what="an orphan recovered")
        recovered = _results((await reaper.get_run(run.id)).messages)
        assert (await reaper.run_until_stop(run.id)).kind is StopKind.ANSWERED
        view = await reaper.get_run(run.id)
        events = await reaper.events(run.id)
    finally:
        reaper.close()
    # The deduplicating write was re-issued under its key and answered with its first
    # result, the other was found by its key; the read ran again. Each write took effect
    # once; neither ran again.
    assert recovered == [
        {"name": "t", "deduped": True},
        {"name": "r", "met": True},
        {"name": "s", "found": True},
    ]
    assert sorted(e.data["tool"] for e in events if e.kind == "reconciled") == ["stamp", "tally"]
    assert sorted(len(v) for v in calls.effects.values()) == [1, 1]
    assert calls.log.count("start:t") == calls.log.count("start:s") == 1
    assert calls.log.count("start:r") == 2
    assert view.run.state is RunState.ANSWERED
