"""A tool's checks (permission, preview, guard, conditional confirmation, reconcile) are
bounded by its ``check_timeout_s`` as a call is by its timeout: a check that never answers
refuses the call (fails closed), asks a human (a conditional confirmation), or could not
ask (a reconcile). The hanging checks wait on events the tests never set (released at
teardown); the assertions are on outcomes, never on durations."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from agents import call
from bench import Bench

from tether import GuardResult, Reconciled, Scope, ToolContext, tool
from tether._runtime.step import loop, tool_call
from tether._runtime.step.session import RunSession
from tether.errors import ConfigError
from tether.results import StopKind
from tether.runs import RunState
from tether.store import CallStatus
from tether.tokens import hash_token
from tether.tools.tool import DEFAULT_CHECK_TIMEOUT_S, OutcomeUnknown, Tool

SHORT = 0.05  # the checks' limit in these tests: they never answer, so any limit is passed


@pytest.fixture
def never() -> Iterator[threading.Event]:
    """Set only at teardown, so a plain-function check waiting on it hangs until then."""
    event = threading.Event()
    yield event
    event.set()


def _noop(item: str) -> dict[str, str]:
    return {"item": item}


def test_checks_get_10_s_unless_declared_and_a_bad_limit_is_refused() -> None:
    assert tool(_noop).check_timeout_s == DEFAULT_CHECK_TIMEOUT_S == 10.0
    assert tool(check_timeout_s=0.5)(_noop).check_timeout_s == 0.5
    bad: Any
    for bad in (0, -1, math.inf, math.nan, "5", True, None):
        with pytest.raises(ConfigError, match=r"tool _noop: check_timeout_s must be"):
            tool(check_timeout_s=bad)(_noop)


def _put(ran: list[str], **declared: Any) -> Tool:
    @tool(effect="write", dedupes=True, check_timeout_s=SHORT, **declared)
    def put(ctx: ToolContext, item: str) -> dict[str, str]:
        """A write."""
        ran.append(item)
        return {"item": item}

    return put


def _put_a() -> dict[str, Any]:
    return {"tool_calls": [call("put", item="a")]}


def _hanging(role: str, never: threading.Event) -> dict[str, Any]:
    """The declaration of ``put`` whose ``role`` check never answers (async or plain)."""

    async def guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
        await asyncio.Event().wait()
        return GuardResult.allow()

    def permitted(args: Any, scope: Scope) -> bool:
        return never.wait()

    def preview(args: Any, scope: Scope) -> dict[str, Any]:
        never.wait()
        return {"item": args.item}

    if role == "guard":
        return {"guard": guard}
    if role == "permission check":
        return {"permitted": permitted}
    return {"preview": preview, "needs_confirmation": True}


@pytest.mark.parametrize("role", ["guard", "permission check", "preview"])
async def test_a_check_that_never_answers_refuses_the_call_and_nothing_runs(
    sqlite_url: str, never: threading.Event, role: str
) -> None:
    ran: list[str] = []
    with Bench(sqlite_url, _put(ran, **_hanging(role, never)), turns=[_put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        assert await tool_call.first_call(session, put) is None

        assert ran == []
        (result,) = [json.loads(m["content"]) for m in bench.results(session.run.id)]
        assert result["error"] == "guard_failed"
        assert f"the {role} of put did not answer within" in result["message"]
        assert [e.status for e in bench.ledger(session.run.id)] == [CallStatus.ERROR]
        assert bench.stored(session.run.id).state is RunState.RUNNING  # the model is told


async def test_a_guard_that_never_answers_on_a_decision_refuses_the_approved_call(
    sqlite_url: str,
) -> None:
    asked: list[str] = []

    async def guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
        asked.append("guard")
        if ctx.confirmed:  # the re-check after the approval hangs
            await asyncio.Event().wait()
        return GuardResult.allow()

    def preview(args: Any, scope: Scope) -> dict[str, Any]:
        return {"item": args.item}

    ran: list[str] = []
    put = _put(ran, needs_confirmation=True, preview=preview, guard=guard)
    with Bench(sqlite_url, put, turns=[_put_a()]) as bench:
        session = await bench.session()
        (called,) = await bench.turn(session)
        suspended = await tool_call.first_call(session, called)
        assert suspended is not None and suspended.notice is not None
        session.close()
        claim = bench.store.claim_decision(
            run_id=session.run.id,
            token_hash=hash_token(suspended.notice.token),
            owner="approver-process",
            decision="approve",
            approver="dana",
        )
        assert claim.run is not None
        decided = await RunSession.start(bench.services, claim.run)

        assert await loop.process(decided, called) is None  # the run goes on, told why

        assert ran == [] and asked == ["guard", "guard"]
        (result,) = [json.loads(m["content"]) for m in bench.results(session.run.id)]
        assert result["error"] == "guard_failed"
        assert "the guard of put did not answer within" in result["message"]


async def test_a_conditional_confirmation_that_never_answers_asks_a_human(
    sqlite_url: str, never: threading.Event
) -> None:
    ran: list[str] = []

    def large(args: Any, scope: Scope) -> bool:
        return never.wait()

    with Bench(sqlite_url, _put(ran, needs_confirmation=large), turns=[_put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        stop = await tool_call.first_call(session, put)

        assert stop is not None and stop.kind is StopKind.SUSPENDED and ran == []
        assert bench.stored(session.run.id).state is RunState.SUSPENDED


async def test_a_reconcile_that_never_answers_could_not_ask_and_the_run_fails_unreconcilable(
    sqlite_url: str,
) -> None:
    asked: list[str] = []

    async def find(key: str, ctx: ToolContext) -> Reconciled:
        asked.append(key)
        await asyncio.Event().wait()
        return Reconciled.absent()

    @tool(effect="write", reconcile=find, check_timeout_s=SHORT)
    def put(ctx: ToolContext, item: str) -> dict[str, str]:
        """A write whose downstream never says whether it took effect."""
        raise OutcomeUnknown("the downstream timed out")

    with Bench(sqlite_url, put, turns=[_put_a()], reconcile_patience_s=SHORT) as bench:
        session = await bench.session()
        (called,) = await bench.turn(session)

        stop = await tool_call.first_call(session, called)

        assert stop is not None and stop.reason == "unreconcilable" and asked
        assert [e.data["found"] for e in bench.events(session.run.id, "reconciled")] == [
            "unreachable"
        ]
        (entry,) = bench.ledger(session.run.id)
        assert entry.status is CallStatus.UNKNOWN and entry.result["error"] == "unreconcilable"
