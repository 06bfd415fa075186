"""Tool timeouts and retries (reference §10), on both backends: a tool that hangs forever does
not stick the run; a read is retried with backoff, then the model sees ``tool_timeout`` or
``tool_unavailable``; the retries of one call are one tool call; a write that times out is
reconciled by its key before the loop goes on, and takes effect at most once."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import inprocess
import pytest
from agents import call
from waiting import until

from tether import (
    Agent,
    Engine,
    OutcomeUnknown,
    Reconciled,
    StopKind,
    ToolContext,
    ToolUnavailable,
    tool,
)
from tether.results import RunView
from tether.store import CallStatus

SHORT = 0.2  # the declared timeout of every tool here: each hangs far longer


class Downstream:
    """What the tools did, owned by the test: calls per tool, effects by idempotency key,
    and a gate that blocked threads wait on (opened at teardown)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.effects: dict[str, list[str]] = {}
        self.gate = threading.Event()
        self.cancelled: list[str] = []
        self.failures: list[BaseException | str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.run_id = ""

    def enter(self, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name]

    def apply(self, ctx: ToolContext, item: str) -> None:
        self.effects.setdefault(ctx.idempotency_key, []).append(item)

    def find(self, key: str, ctx: ToolContext) -> Reconciled:
        done = self.effects.get(key)
        return Reconciled.found({"item": done[0], "found": True}) if done else Reconciled.absent()

    async def hang(self, name: str) -> None:
        """Wait for an event nobody sets; record the cancellation that ends it."""
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled.append(name)


@pytest.fixture
def down() -> Iterator[Downstream]:
    downstream = Downstream()
    yield downstream
    downstream.gate.set()  # no thread of a test outlives it


def _agent(d: Downstream) -> Agent:
    @tool(timeout_s=SHORT, retries=2)
    async def hang_async(q: str) -> dict[str, Any]:
        """A read that never answers."""
        d.enter("hang_async")
        await d.hang("hang_async")
        return {}

    @tool(timeout_s=SHORT, retries=1)
    def hang_thread(q: str) -> dict[str, Any]:
        """A plain-function read blocked until the test ends."""
        d.enter("hang_thread")
        d.gate.wait()
        return {}

    @tool(timeout_s=SHORT, retries=2)
    async def flaky(q: str) -> dict[str, Any]:
        """A read that fails (or hangs) as ``failures`` says, then answers."""
        n = d.enter("flaky")
        failure = d.failures[n - 1] if n <= len(d.failures) else None
        if failure == "hang":
            await d.hang("flaky")
        elif isinstance(failure, BaseException):
            raise failure
        return {"answer": q}

    @tool
    async def down_read(q: str) -> dict[str, Any]:
        """A read whose downstream is down."""
        d.enter("down_read")
        raise ToolUnavailable("the index is down")

    @tool(timeout_s=60)
    async def slow_read(ctx: ToolContext, q: str) -> dict[str, Any]:
        """A read that waits on the test, far longer than the heartbeat timeout."""
        d.run_id = ctx.run_id
        d.started.set()
        await d.release.wait()
        return {"slow": q}

    @tool(effect="write", reconcile=d.find, timeout_s=SHORT)
    async def write_async(ctx: ToolContext, item: str, first: bool) -> dict[str, Any]:
        """A write that hangs after (``first``) or before taking effect."""
        d.enter("write_async")
        if first:
            d.apply(ctx, item)
        await d.hang("write_async")
        d.apply(ctx, item)  # never reached: the call is cancelled at its timeout
        return {}

    @tool(effect="write", reconcile=d.find, timeout_s=SHORT)
    def write_thread(ctx: ToolContext, item: str, first: bool) -> dict[str, Any]:
        """A plain-function write that blocks after (``first``) or before taking effect;
        one that blocked first takes effect once released."""
        d.enter("write_thread")
        if first:
            d.apply(ctx, item)
        d.gate.wait()
        if not first:
            d.apply(ctx, item)
        return {}

    return Agent(
        name="timeouts",
        system_prompt="test",
        tools=(hang_async, hang_thread, flaky, down_read, slow_read, write_async, write_thread),
    )


async def _ask(engine: Engine) -> RunView:
    """Start a run and carry it to its next stop (bounded, so a stuck run fails the test
    instead of hanging it)."""
    outcome = await asyncio.wait_for(engine.ask("dana", "go"), timeout=60)
    assert outcome.kind in (StopKind.ANSWERED, StopKind.FAILED), outcome
    return await engine.get_run(outcome.run_id)


def _turns(tool_name: str, **arguments: Any) -> list[dict[str, Any]]:
    return [{"tool_calls": [call(tool_name, **arguments)]}, {"content": "done"}]


def _result(view: RunView) -> Any:
    (content,) = [m["content"] for m in view.messages if m["role"] == "tool"]
    return json.loads(content)


@pytest.mark.parametrize(("tool_name", "tries"), [("hang_async", 3), ("hang_thread", 2)])
async def test_a_read_that_hangs_forever_is_retried_then_the_model_sees_tool_timeout(
    db_url: str, down: Downstream, tool_name: str, tries: int
) -> None:
    engine = inprocess.engine_for(db_url, _agent(down), _turns(tool_name, q="x"))
    try:
        view = await _ask(engine)
        ledger = await engine.ledger(view.run.id)
    finally:
        engine.close()
    assert view.run.state.value == "answered"  # not stuck: it reached its next stop
    result = _result(view)
    assert result["error"] == "tool_timeout"
    assert f"tried {tries} times" in result["message"]
    assert down.calls[tool_name] == tries
    assert view.run.budget.tool_calls == 1  # the retries of one call are one tool call
    assert [e.status for e in ledger] == [CallStatus.ERROR]
    if tool_name == "hang_async":
        assert down.cancelled == ["hang_async"] * tries  # each attempt was cancelled


@pytest.mark.parametrize(
    "failure",
    [ToolUnavailable("busy"), OutcomeUnknown("503 from the index"), "hang"],
    ids=["tool_unavailable", "outcome_unknown", "timeout"],
)
async def test_a_transient_read_failure_then_success_gives_the_result_as_one_tool_call(
    db_url: str, down: Downstream, failure: BaseException | str
) -> None:
    down.failures = [failure]
    engine = inprocess.engine_for(db_url, _agent(down), _turns("flaky", q="x"))
    try:
        view = await _ask(engine)
        ledger = await engine.ledger(view.run.id)
    finally:
        engine.close()
    assert _result(view) == {"answer": "x"}
    assert down.calls["flaky"] == 2
    assert view.run.budget.tool_calls == 1
    assert [e.status for e in ledger] == [CallStatus.OK]


async def test_a_read_that_stays_unavailable_gives_tool_unavailable_without_retries(
    db_url: str, down: Downstream
) -> None:
    engine = inprocess.engine_for(db_url, _agent(down), _turns("down_read", q="x"))
    try:
        view = await _ask(engine)
    finally:
        engine.close()
    assert _result(view) == {"error": "tool_unavailable", "message": "the index is down"}
    assert down.calls["down_read"] == 1  # retries=0, the default


@pytest.mark.parametrize("tool_name", ["write_async", "write_thread"])
async def test_a_write_that_hangs_after_its_effect_is_reconciled_to_its_result_once(
    db_url: str, down: Downstream, tool_name: str
) -> None:
    engine = inprocess.engine_for(db_url, _agent(down), _turns(tool_name, item="a", first=True))
    try:
        view = await _ask(engine)
        ledger = await engine.ledger(view.run.id)
        events = await engine.events(view.run.id)
    finally:
        engine.close()
    assert view.run.state.value == "answered"
    assert _result(view) == {"item": "a", "found": True}  # what reconcile found
    assert down.calls[tool_name] == 1  # never run again
    assert [len(items) for items in down.effects.values()] == [1]
    assert [e.status for e in ledger] == [CallStatus.OK]
    reconciled = [e.data for e in events if e.kind == "reconciled"]
    assert [r["found"] for r in reconciled] == ["found"]
    down.gate.set()  # the abandoned thread ends: it adds nothing
    assert [len(items) for items in down.effects.values()] == [1]


async def test_an_async_write_that_hangs_before_its_effect_did_not_complete(
    db_url: str, down: Downstream
) -> None:
    engine = inprocess.engine_for(
        db_url, _agent(down), _turns("write_async", item="a", first=False)
    )
    try:
        view = await _ask(engine)
    finally:
        engine.close()
    assert view.run.state.value == "answered"
    assert _result(view)["error"] == "not_completed"
    assert down.cancelled == ["write_async"]  # cancelled at its timeout, so it never will
    assert down.effects == {}
    assert view.run.budget.tool_calls == 0


async def test_a_thread_write_still_running_is_not_taken_for_absent(
    db_url: str, down: Downstream
) -> None:
    """Its reconcile answers "absent" while the abandoned thread may still write: that is
    not an answer. Once the patience is spent the run fails ``unreconcilable`` for a person,
    rather than telling the model the write did not happen."""
    engine = inprocess.engine_for(
        db_url,
        _agent(down),
        _turns("write_thread", item="a", first=False),
        reconcile_patience_s=0.5,
    )
    try:
        view = await _ask(engine)
        ledger = await engine.ledger(view.run.id)
        events = await engine.events(view.run.id)
    finally:
        engine.close()
    assert view.run.state.value == "failed" and view.run.fail_reason == "unreconcilable"
    assert [e.status for e in ledger] == [CallStatus.UNKNOWN]
    assert [e.data["found"] for e in events if e.kind == "reconciled"] == ["unreachable"]
    down.gate.set()  # the downstream finally answers: the write lands, once
    await until(lambda: down.effects, timeout=10, what="the write to land")
    assert [len(items) for items in down.effects.values()] == [1]
    assert down.calls["write_thread"] == 1


@pytest.mark.slow
async def test_the_heartbeat_keeps_the_lease_while_a_tool_outlasts_the_heartbeat_timeout(
    db_url: str, down: Downstream
) -> None:
    engine = inprocess.engine_for(
        db_url, _agent(down), _turns("slow_read", q="x"), heartbeat_timeout_s=1.5
    )
    rival = inprocess.engine_for(db_url, _agent(Downstream()), [], heartbeat_timeout_s=1.5)
    try:
        asking = asyncio.ensure_future(engine.ask("dana", "go"))
        await asyncio.wait_for(down.started.wait(), 30)
        started = await asyncio.to_thread(engine.runner.store.now)

        async def beaten_well_after_the_call_began() -> bool:
            run = await asyncio.to_thread(engine.runner.store.get_run, down.run_id)
            assert run is not None
            return (run.heartbeat_at or 0) > started + 1.5

        await until(beaten_well_after_the_call_began, what="a heartbeat during the call")
        assert await rival.runner.recover_orphans() == []  # its lease is live: nobody takes it
        assert not asking.done()
        down.release.set()
        outcome = await asyncio.wait_for(asking, 60)
        view = await engine.get_run(outcome.run_id)
    finally:
        engine.close()
        rival.close()
    # Its writes after the long call were accepted: it kept its lease all along.
    assert outcome.kind is StopKind.ANSWERED
    assert _result(view) == {"slow": "x"}
    assert view.run.recovery_attempts == 0
