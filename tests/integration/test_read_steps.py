"""Read-only steps (docs/step-protocol.md): a turn whose calls are all plain reads runs
them concurrently and stores the turn, its results and its counters in one commit; the
reads of a mixed turn run concurrently too, while writes run alone and in order; results
are stored in the model's call order; a read that raises is a ``tool_error`` the model
sees. On both backends."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import inprocess
import pytest
from agents import call
from inprocess import count_calls

from tether import Agent, ToolContext, tool
from tether.results import StopKind
from tether.store import CallStatus


class Meeting:
    """Counts calls in flight: a call of ``meet`` waits (bounded) until ``size`` calls are
    in flight together, so it can only succeed when they run concurrently."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.order: list[str] = []
        self._changed = asyncio.Condition()

    async def enter(self, name: str, size: int) -> bool:
        async with self._changed:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self._changed.notify_all()
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.in_flight >= size), timeout=5.0
                )
                met = True
            except TimeoutError:
                met = False
        async with self._changed:
            self.in_flight -= 1
            self.order.append(name)
        return met


def _agent(meeting: Meeting) -> Agent:
    @tool
    async def meet(label: str, size: int) -> dict[str, Any]:
        """A read that waits for ``size`` calls to be in flight together."""
        return {"name": label, "met": await meeting.enter(label, size)}

    @tool(effect="write", dedupes=True)
    async def note(ctx: ToolContext, label: str) -> dict[str, Any]:
        """A write: records how many other calls were in flight when it started."""
        alongside = meeting.in_flight
        met = await meeting.enter(label, 1)
        return {"name": label, "met": met, "alongside": alongside}

    @tool
    async def boom() -> dict[str, Any]:
        """A read with a bug in it."""
        raise RuntimeError("a bug in a read")

    return Agent(name="reads", system_prompt="test", tools=(meet, note, boom))


def _results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


async def test_a_read_only_turn_runs_its_reads_together_and_is_one_commit(db_url: str) -> None:
    meeting = Meeting()
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("meet", label=n, size=3) for n in ("a", "b", "c")]},
        {"tool_calls": [call("meet", label="d", size=1), call("nope")]},
        {"content": "done"},
    ]
    engine = inprocess.engine_for(db_url, _agent(meeting), turns)
    turn_writes = count_calls(engine, "persist_turn")
    result_writes = count_calls(engine, "persist_tool_result")
    try:
        outcome = await engine.ask("dana", "go")
        view = await engine.get_run(outcome.run_id)
        ledger = await engine.ledger(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    results = _results(view.messages)
    assert [r.get("name") for r in results] == ["a", "b", "c", "d", None]  # call order
    assert all(r["met"] for r in results[:4]), "the three reads did not run together"
    assert results[4]["error"] == "unknown_tool"
    # Three step writes (two read-only steps and the answer), no separate result write.
    assert [len(w["results"]) for w in turn_writes] == [3, 2, 0]
    assert result_writes == []
    assert [(e.tool, e.status) for e in ledger] == [
        ("meet", CallStatus.OK),
        ("meet", CallStatus.OK),
        ("meet", CallStatus.OK),
        ("meet", CallStatus.OK),
        ("nope", CallStatus.ERROR),
    ]
    assert all(e.outcome_at is not None for e in ledger)
    budget = view.run.budget
    assert (budget.steps, budget.tool_calls) == (3, 4)  # the refused call is not counted
    assert [m["role"] for m in view.messages][2:] == [
        "assistant",
        *["tool"] * 3,
        "assistant",
        *["tool"] * 2,
        "assistant",
    ]


async def test_a_mixed_turn_runs_its_reads_together_and_its_writes_alone_in_order(
    db_url: str,
) -> None:
    meeting = Meeting()
    turns: list[dict[str, Any]] = [
        {
            "tool_calls": [
                call("meet", label="r1", size=2),
                call("meet", label="r2", size=2),
                call("note", label="w1"),
                call("meet", label="r3", size=1),
                call("note", label="w2"),
            ]
        },
        {"content": "done"},
    ]
    engine = inprocess.engine_for(db_url, _agent(meeting), turns)
    turn_writes = count_calls(engine, "persist_turn")
    try:
        outcome = await engine.ask("dana", "go")
        view = await engine.get_run(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    results = _results(view.messages)
    assert [r["name"] for r in results] == ["r1", "r2", "w1", "r3", "w2"]
    assert results[0]["met"] and results[1]["met"], "the two reads did not run together"
    # Each write ran with nothing beside it, after the calls before it, in order.
    assert meeting.order[2:] == ["w1", "r3", "w2"]
    assert [r["alongside"] for r in results if r["name"].startswith("w")] == [0, 0]
    # The turn (with its intents) was stored before any call ran: the two-write path.
    assert [len(w["results"]) for w in turn_writes] == [0, 0]


@pytest.mark.parametrize("max_tool_calls", [2, 3])
async def test_the_tool_call_budget_still_halts_between_the_same_calls(
    db_url: str, max_tool_calls: int
) -> None:
    """A read-only turn the budget could stop partway takes the two-write path, so the
    halt falls where it always did: after ``max_tool_calls`` results."""
    meeting = Meeting()
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("meet", label=n, size=1) for n in ("a", "b", "c", "d")]},
        {"content": "done"},
    ]
    engine = inprocess.engine_for(db_url, _agent(meeting), turns)
    try:
        outcome = await engine.ask("dana", "go", limits={"max_tool_calls": max_tool_calls})
        view = await engine.get_run(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.HALTED and outcome.reason == "max_tool_calls"
    assert [r["name"] for r in _results(view.messages)] == ["a", "b", "c", "d"][:max_tool_calls]
    assert view.run.budget.tool_calls == max_tool_calls


async def test_a_read_that_raises_is_a_tool_error_and_its_step_goes_on(db_url: str) -> None:
    """A bug in a read is what the model sees of that call (reference §1): the other
    read's result is kept, the step is one commit as any read-only step, and the run goes
    on to its answer."""
    meeting = Meeting()
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("meet", label="a", size=1), call("boom")]},
        {"content": "done"},
    ]
    engine = inprocess.engine_for(db_url, _agent(meeting), turns)
    turn_writes = count_calls(engine, "persist_turn")
    try:
        outcome = await engine.ask("dana", "go")
        view = await engine.get_run(outcome.run_id)
        ledger = await engine.ledger(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    first, second = _results(view.messages)
    assert first == {"name": "a", "met": True}
    assert second["error"] == "tool_error" and "a bug in a read" in second["message"]
    assert [e.status for e in ledger] == [CallStatus.OK, CallStatus.ERROR]
    assert [len(w["results"]) for w in turn_writes] == [2, 0]
