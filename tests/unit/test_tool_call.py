"""One tool call (``tether._runtime.step.tool_call``) on a real SQLite store: resolve → re-check
(permitted → preview → guard) → execute under the call's idempotency key → reconcile a
write whose outcome is not known. Each test drives the module's own functions on a
claimed run's session and reads back what the store holds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents import call
from bench import Bench
from waiting import until

from tether import GuardResult, Reconciled, Scope, ToolContext, tool
from tether._runtime.step import loop, tool_call
from tether._runtime.step.session import RunSession
from tether.errors import LeaseLost
from tether.previews import digest
from tether.reasons import HaltReason
from tether.results import StopKind
from tether.runs import RunState
from tether.store import CallStatus
from tether.tokens import hash_token
from tether.tools.tool import OutcomeUnknown, Tool, ToolFailed


@dataclass
class Downstream:
    """A downstream of the test's own: what each key did, and one injected ambiguous
    failure (``before``: nothing committed; ``after``: committed, then no answer)."""

    failure: str | None = None
    dedupe: bool = False
    effects: dict[str, list[str]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # every call's key, in order

    def write(self, ctx: ToolContext, item: str) -> dict[str, Any]:
        self.keys.append(ctx.idempotency_key)
        failure, self.failure = self.failure, None
        if failure == "before":
            raise OutcomeUnknown("downstream timed out")
        done = self.effects.setdefault(ctx.idempotency_key, [])
        if not (self.dedupe and done):
            done.append(item)
        if failure == "after":
            raise OutcomeUnknown("downstream answered 503 after committing")
        return {"item": done[0]}

    def find(self, key: str, _ctx: ToolContext) -> Reconciled:
        if key in self.effects:
            return Reconciled.found({"item": self.effects[key][0]})
        return Reconciled.absent()


def reads(ran: list[str]) -> Tool:
    @tool
    def look(query: str) -> dict[str, str]:
        """A read."""
        ran.append(query)
        return {"answer": f"about {query}"}

    return look


def writes(down: Downstream, **declared: Any) -> Tool:
    @tool(effect="write", **declared)
    def put(ctx: ToolContext, item: str) -> dict[str, Any]:
        """A write downstream."""
        return down.write(ctx, item)

    return put


def content(message: dict[str, Any]) -> Any:
    return json.loads(message["content"])


# -- reads ---------------------------------------------------------------------------------


async def test_a_read_runs_once_and_its_result_is_stored_once_with_its_outcome(
    sqlite_url: str,
) -> None:
    ran: list[str] = []
    turns = [{"tool_calls": [call("look", query="x")]}]
    with Bench(sqlite_url, reads(ran), turns=turns) as bench:
        session = await bench.session()
        (look,) = await bench.turn(session)
        assert [e.status for e in bench.ledger(session.run.id)] == [CallStatus.INTENT]

        assert await tool_call.first_call(session, look) is None

        run_id = session.run.id
        assert ran == ["x"]
        results = bench.results(run_id)
        assert [(m["tool_call_id"], content(m)) for m in results] == [
            (look.id, {"answer": "about x"})
        ]
        (entry,) = bench.ledger(run_id)
        assert entry.status is CallStatus.OK and entry.idempotency_key == f"{run_id}:{look.id}"
        assert session.budget.tool_calls == bench.stored(run_id).budget.tool_calls == 1
        assert session.messages == bench.messages(run_id) and session.pending_calls() == []


async def test_a_read_only_step_runs_before_anything_is_written_then_is_one_commit(
    sqlite_url: str,
) -> None:
    ran: list[str] = []
    turns = [{"tool_calls": [call("look", query="a"), call("look", query="b")]}]
    with Bench(sqlite_url, reads(ran), turns=turns) as bench:
        session = await bench.session()
        run_id = session.run.id
        before = bench.messages(run_id)
        response = await bench.model.request(session.messages, list(bench.agent.tool_specs))
        turn = session.turn_of(response)

        results = await tool_call.read_step(session, turn.calls)

        assert results is not None and sorted(ran) == ["a", "b"]
        assert bench.messages(run_id) == before and bench.ledger(run_id) == []  # not yet
        await session.append_turn(turn, results)
        stored = bench.messages(run_id)
        assert len(stored) == len(before) + 3  # the turn and both results, together
        assert [content(m) for m in stored[-2:]] == [{"answer": "about a"}, {"answer": "about b"}]
        assert [e.status for e in bench.ledger(run_id)] == [CallStatus.OK, CallStatus.OK]
        assert bench.stored(run_id).budget.tool_calls == 2 and session.pending_calls() == []


async def test_a_turn_with_a_write_is_no_read_step_and_runs_nothing(sqlite_url: str) -> None:
    ran: list[str] = []
    down = Downstream()
    turns = [{"tool_calls": [call("look", query="a"), call("put", item="b")]}]
    with Bench(sqlite_url, reads(ran), writes(down, dedupes=True), turns=turns) as bench:
        session = await bench.session()
        response = await bench.model.request(session.messages, list(bench.agent.tool_specs))

        assert await tool_call.read_step(session, session.turn_of(response).calls) is None
        assert ran == [] and down.keys == []


async def test_an_unknown_tool_or_arguments_that_do_not_fit_are_refused_without_running(
    sqlite_url: str,
) -> None:
    ran: list[str] = []
    turns = [{"tool_calls": [call("nothing_like_it"), call("look", query=7)]}]
    with Bench(sqlite_url, reads(ran), turns=turns) as bench:
        session = await bench.session()
        unknown, invalid = await bench.turn(session)

        assert await tool_call.first_call(session, unknown) is None
        assert await tool_call.first_call(session, invalid) is None

        errors = [content(m)["error"] for m in bench.results(session.run.id)]
        assert errors == ["unknown_tool", "invalid_arguments"] and ran == []
        assert bench.stored(session.run.id).budget.tool_calls == 0  # neither ran: not counted


# -- writes and their reconciliation -------------------------------------------------------


async def test_a_write_whose_outcome_is_unknown_but_took_effect_is_found_by_key_not_rerun(
    sqlite_url: str,
) -> None:
    down = Downstream(failure="after")
    with Bench(sqlite_url, writes(down, reconcile=down.find), turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        assert await tool_call.first_call(session, put) is None

        key = f"{session.run.id}:{put.id}"
        assert down.keys == [key] and down.effects == {key: ["a"]}  # one effect, never re-run
        assert [content(m) for m in bench.results(session.run.id)] == [{"item": "a"}]
        assert [e.status for e in bench.ledger(session.run.id)] == [CallStatus.OK]
        found = bench.events(session.run.id, "reconciled")
        assert [e.data["found"] for e in found] == ["found"]
        assert bench.stored(session.run.id).budget.tool_calls == 1


async def test_a_write_whose_outcome_is_unknown_and_absent_did_not_complete(
    sqlite_url: str,
) -> None:
    down = Downstream(failure="before")
    with Bench(sqlite_url, writes(down, reconcile=down.find), turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        assert await tool_call.first_call(session, put) is None

        assert len(down.keys) == 1 and down.effects == {}
        (result,) = bench.results(session.run.id)
        assert content(result)["error"] == "not_completed"
        assert [e.status for e in bench.ledger(session.run.id)] == [CallStatus.ERROR]
        assert bench.stored(session.run.id).budget.tool_calls == 0  # it had no effect


async def test_a_deduplicated_write_whose_outcome_is_unknown_is_reissued_under_the_same_key(
    sqlite_url: str,
) -> None:
    down = Downstream(failure="after", dedupe=True)
    with Bench(sqlite_url, writes(down, dedupes=True), turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        assert await tool_call.first_call(session, put) is None

        key = f"{session.run.id}:{put.id}"
        assert down.keys == [key, key]  # the re-issue, under the same key
        assert down.effects == {key: ["a"]}  # which the downstream answered from the first
        assert [content(m) for m in bench.results(session.run.id)] == [{"item": "a"}]


async def test_a_write_whose_outcome_cannot_be_learnt_fails_the_run_unreconcilable(
    sqlite_url: str,
) -> None:
    down = Downstream(failure="after")

    def cannot_tell(key: str, ctx: ToolContext) -> Reconciled:
        return Reconciled.unknown("no way to ask")

    with Bench(sqlite_url, writes(down, reconcile=cannot_tell), turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        stop = await tool_call.first_call(session, put)

        assert stop is not None and stop.kind is StopKind.FAILED
        assert stop.reason == "unreconcilable"
        run = bench.stored(session.run.id)
        assert run.state is RunState.FAILED and run.fail_reason == "unreconcilable"
        assert [e.status for e in bench.ledger(run.id)] == [CallStatus.UNKNOWN]
        assert bench.results(run.id) == [] and len(down.keys) == 1


async def test_a_write_pending_after_a_takeover_is_reconciled_before_anything_runs(
    sqlite_url: str,
) -> None:
    down = Downstream()
    with Bench(sqlite_url, writes(down, reconcile=down.find), turns=[put_a()]) as bench:
        crashed = await bench.session()
        (put,) = await bench.turn(crashed)
        key = f"{crashed.run.id}:{put.id}"
        down.effects[key] = ["a"]  # it took effect; its owner died before storing a result
        await crashed.release("the owner died")
        crashed.close()

        heir = await RunSession.start(
            bench.services, await bench.claim(crashed.run.id), recovering=True
        )
        assert [c.id for c in heir.pending_calls()] == [put.id]
        assert await tool_call.first_call(heir, put) is None

        assert down.keys == []  # asked by key, never run again
        assert [content(m) for m in bench.results(heir.run.id)] == [{"item": "a"}]


def put_a() -> dict[str, Any]:
    return {"tool_calls": [call("put", item="a")]}


# -- re-checks -----------------------------------------------------------------------------


async def _hold(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    return GuardResult.refuse("the account is on hold")


def _yes(args: Any, scope: Scope, ctx: ToolContext) -> bool:
    return True


def _unreachable(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    raise ToolFailed("the credit service is down")


def _silent(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    return GuardResult(ok=False)


@pytest.mark.parametrize(
    ("guard", "reason"),
    [
        (_hold, "the account is on hold"),
        (_yes, "answered True, not GuardResult.allow()"),
        (_unreachable, "could not check this call: the credit service is down"),
        (_silent, "refused"),
    ],
)
async def test_a_guard_that_does_not_allow_explicitly_refuses_and_nothing_runs(
    sqlite_url: str, guard: Any, reason: str
) -> None:
    down = Downstream()
    tools = [writes(down, dedupes=True, guard=guard)]
    with Bench(sqlite_url, *tools, turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        assert await tool_call.first_call(session, put) is None

        assert down.keys == []
        (result,) = bench.results(session.run.id)
        assert content(result)["error"] == "guard_failed" and reason in content(result)["message"]
        assert [e.status for e in bench.ledger(session.run.id)] == [CallStatus.ERROR]
        assert bench.stored(session.run.id).budget.tool_calls == 0


async def test_the_permission_is_checked_with_the_scope_resolved_when_the_session_starts(
    sqlite_url: str,
) -> None:
    allowed = {"dana": True}
    checked: list[bool] = []

    async def resolve(user_id: str) -> Scope:
        return Scope(user_id=user_id, permissions={"can_put": allowed[user_id]})

    def permitted(args: Any, scope: Scope) -> bool:
        checked.append(bool(scope.permissions["can_put"]))
        return bool(scope.permissions["can_put"])

    down = Downstream()
    tools = [writes(down, dedupes=True, permitted=permitted)]
    with Bench(sqlite_url, *tools, turns=[put_a()], resolve=resolve) as bench:
        run = await bench.new_run()  # created while dana may write
        assert run.scope_snapshot["permissions"] == {"can_put": True}
        allowed["dana"] = False  # revoked before a worker takes the run
        session = await RunSession.start(bench.services, await bench.claim(run.id))
        (put,) = await bench.turn(session)

        assert await tool_call.first_call(session, put) is None

        assert checked == [False] and down.keys == []
        assert bench.stored(run.id).scope_snapshot["permissions"] == {"can_put": False}
        assert content(bench.results(run.id)[0])["error"] == "not_permitted"


async def test_an_approved_call_is_checked_again_when_it_executes(sqlite_url: str) -> None:
    """Permitted when it suspended, revoked while it waited: the approval re-resolves the
    scope, the call is refused ``no_longer_permitted`` and the run halts; it never ran."""
    allowed = {"dana": True}

    async def resolve(user_id: str) -> Scope:
        return Scope(
            user_id=user_id,
            permissions={"can_put": allowed[user_id]},
            approvers=frozenset({"boss"}),
        )

    def preview(args: Any, scope: Scope) -> dict[str, Any]:
        return {"item": args.item}

    def permitted(args: Any, scope: Scope) -> bool:
        return bool(scope.permissions["can_put"])

    down = Downstream()
    tools = [
        writes(down, dedupes=True, needs_confirmation=True, preview=preview, permitted=permitted)
    ]
    with Bench(sqlite_url, *tools, turns=[put_a()], resolve=resolve) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)
        suspended = await tool_call.first_call(session, put)
        assert suspended is not None and suspended.kind is StopKind.SUSPENDED
        assert suspended.notice is not None
        session.close()
        allowed["dana"] = False

        claim = bench.store.claim_decision(
            run_id=session.run.id,
            token_hash=hash_token(suspended.notice.token),
            owner="approver-process",
            decision="approve",
            approver="boss",
        )
        assert claim.run is not None and claim.decision is not None
        decided = await RunSession.start(bench.services, claim.run)
        stop = await loop.process(decided, put)

        assert stop is not None and stop.kind is StopKind.HALTED
        assert stop.reason == HaltReason.NO_LONGER_PERMITTED.value
        assert down.keys == []
        assert content(bench.results(session.run.id)[0])["error"] == "no_longer_permitted"


async def test_a_call_that_needs_confirmation_suspends_with_its_preview_and_does_not_run(
    sqlite_url: str,
) -> None:
    def preview(args: Any, scope: Scope) -> dict[str, Any]:
        return {"item": args.item, "price": 100}

    down = Downstream()
    tools = [writes(down, dedupes=True, needs_confirmation=True, preview=preview)]
    with Bench(sqlite_url, *tools, turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)

        stop = await tool_call.first_call(session, put)

        assert stop is not None and stop.kind is StopKind.SUSPENDED and down.keys == []
        assert [n.preview for n in bench.notifier.notices] == [{"item": "a", "price": 100}]
        run = bench.stored(session.run.id)
        assert run.state is RunState.SUSPENDED and run.pending is not None
        assert run.pending.tool_call_id == put.id
        assert run.pending.digest == digest({"item": "a", "price": 100})
        assert stop.notice is not None and run.pending_token_hash == hash_token(stop.notice.token)
        assert [e.status for e in bench.ledger(run.id)] == [CallStatus.INTENT]  # not run


async def test_a_tool_call_past_the_budget_halts_the_run_before_it_runs(sqlite_url: str) -> None:
    down = Downstream()
    turns = [{"tool_calls": [call("put", item="a"), call("put", item="b")]}]
    with Bench(sqlite_url, writes(down, dedupes=True), turns=turns) as bench:
        session = await bench.session(limits={"max_tool_calls": 1})
        first, second = await bench.turn(session)

        assert await tool_call.first_call(session, first) is None
        stop = await tool_call.first_call(session, second)

        assert stop is not None and stop.kind is StopKind.HALTED and stop.reason == "max_tool_calls"
        assert list(down.effects.values()) == [["a"]]  # the second never ran
        assert bench.stored(session.run.id).state is RunState.HALTED


# -- a lease lost mid-step -----------------------------------------------------------------


async def test_a_write_whose_lease_was_taken_does_not_run_and_writes_nothing(
    sqlite_url: str,
) -> None:
    down = Downstream()
    with Bench(sqlite_url, writes(down, dedupes=True), turns=[put_a()]) as bench:
        session = await bench.session()
        (put,) = await bench.turn(session)
        stored = bench.messages(session.run.id)
        rival = bench.take_over(session)

        with pytest.raises(LeaseLost):
            await tool_call.first_call(session, put)

        assert down.keys == []  # the lease is asked before a write starts
        assert bench.messages(session.run.id) == stored
        after = bench.stored(session.run.id)
        assert (after.owner, after.lease_epoch) == (rival.owner, rival.lease_epoch)
        assert [e.status for e in bench.ledger(session.run.id)] == [CallStatus.INTENT]


async def test_a_read_that_finishes_after_its_lease_was_taken_stores_nothing(
    sqlite_url: str,
) -> None:
    ran: list[str] = []
    turns = [{"tool_calls": [call("look", query="x")]}]
    with Bench(sqlite_url, reads(ran), turns=turns) as bench:
        session = await bench.session()
        (look,) = await bench.turn(session)
        stored = bench.messages(session.run.id)
        bench.take_over(session)

        with pytest.raises(LeaseLost):
            await tool_call.first_call(session, look)

        assert ran == ["x"]  # a read has no effect; its result is fenced out
        assert bench.messages(session.run.id) == stored and len(session.messages) == len(stored)
        assert bench.stored(session.run.id).budget.tool_calls == 0


async def test_once_the_heartbeat_finds_the_lease_taken_no_tool_starts(sqlite_url: str) -> None:
    ran: list[str] = []
    turns = [{"tool_calls": [call("look", query="x")]}]
    with Bench(sqlite_url, reads(ran), turns=turns, heartbeat_timeout_s=0.3) as bench:
        session = await bench.session()
        (look,) = await bench.turn(session)
        bench.take_over(session)
        heartbeat = bench.services.heartbeat
        await until(lambda: heartbeat.holding == 0, timeout=10, what="the beat to notice")

        with pytest.raises(LeaseLost):
            await tool_call.first_call(session, look)

        assert ran == []


async def test_an_owner_that_lost_the_run_during_a_write_leaves_no_trace_of_its_reconcile(
    sqlite_url: str,
) -> None:
    down = Downstream(failure="after")
    taken: list[RunSession] = []

    def find(key: str, ctx: ToolContext) -> Reconciled:
        return down.find(key, ctx)

    @tool(effect="write", reconcile=find)
    def put(ctx: ToolContext, item: str) -> dict[str, Any]:
        """A write during which another worker takes the run."""
        bench.take_over(taken[0])
        return down.write(ctx, item)

    with Bench(sqlite_url, put, turns=[put_a()]) as bench:
        session = await bench.session()
        taken.append(session)
        (call_,) = await bench.turn(session)
        traced = bench.events(session.run.id)

        with pytest.raises(LeaseLost):
            await tool_call.first_call(session, call_)

        assert bench.results(session.run.id) == []  # its result was fenced out
        new = [e.kind for e in bench.events(session.run.id)[len(traced) :]]
        assert "reconciled" not in new, new
