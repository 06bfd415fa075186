"""A run session (``tether._runtime.step.session.RunSession``) on a real SQLite store: what it
loads when it starts, that each durable write keeps the in-memory messages and budget equal
to what the store holds, that the budget only grows and is restored on load, and that every
write is fenced by the lease."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from agents import call
from bench import Bench

from tether import Scope, tool
from tether._runtime.step import suspending, tool_call
from tether._runtime.step.session import RunSession
from tether.budget import Budget
from tether.errors import LeaseLost
from tether.reasons import FailReason, HaltReason
from tether.results import StopKind
from tether.runs import RunState
from tether.store import CallStatus, Decision
from tether.tokens import hash_token


@tool
def look(query: str) -> dict[str, str]:
    """A read."""
    return {"answer": f"about {query}"}


def _grew(before: Budget, after: Budget) -> bool:
    return all(
        getattr(after, f.name) >= getattr(before, f.name) for f in dataclasses.fields(Budget)
    )


async def test_each_write_keeps_the_budget_equal_to_the_stored_one_and_it_only_grows(
    sqlite_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("look", query="a"), call("look", query="b")]},
        {"tool_calls": [call("look", query="c")]},
    ]
    with Bench(sqlite_url, look, turns=turns) as bench:
        session = await bench.session()
        run_id = session.run.id
        seen = [session.budget]

        def check() -> None:
            assert session.budget == bench.stored(run_id).budget
            assert session.messages == bench.messages(run_id)
            assert _grew(seen[-1], session.budget), (seen[-1], session.budget)
            seen.append(session.budget)

        first, second = await bench.turn(session)
        check()
        await tool_call.first_call(session, first)  # counted: it ran
        check()
        await session.refuse(second, "not_now", "refused by the test")  # not counted
        check()
        (third,) = await bench.turn(session)
        check()
        await session.add_event("note", {"by": "the test"})  # a trace entry, no budget
        check()
        await tool_call.first_call(session, third)
        check()
        await session.release("the test is done")
        assert session.budget == bench.stored(run_id).budget

    assert (seen[-1].steps, seen[-1].tool_calls) == (2, 2)
    assert seen[-1].spend_usd > seen[1].spend_usd > 0  # each turn cost something


async def test_a_new_session_restores_the_budget_and_messages_of_the_last_one(
    sqlite_url: str,
) -> None:
    turns: list[dict[str, Any]] = [{"tool_calls": [call("look", query="a")]}, {"content": "done"}]
    with Bench(sqlite_url, look, turns=turns) as bench:
        first = await bench.session()
        (lookup,) = await bench.turn(first)
        await tool_call.first_call(first, lookup)
        await first.release("handed over")
        first.close()

        second = await RunSession.start(bench.services, await bench.claim(first.run.id))

        assert second.budget == first.budget == bench.stored(first.run.id).budget
        assert second.budget.steps == 1 and second.budget.tool_calls == 1
        assert second.messages == first.messages
        assert second.pending_calls() == []
        assert second.lease.epoch == first.lease.epoch + 1


async def test_start_re_resolves_the_users_scope_and_stores_it(sqlite_url: str) -> None:
    permissions = {"can_send": True}

    async def resolve(user_id: str) -> Scope:
        return Scope(user_id=user_id, permissions=dict(permissions))

    with Bench(sqlite_url, look, resolve=resolve) as bench:
        run = await bench.new_run()
        permissions["can_send"] = False

        session = await RunSession.start(bench.services, await bench.claim(run.id))

        assert session.scope.permissions == {"can_send": False}
        stored = bench.stored(run.id)
        assert stored.scope_snapshot == session.scope.to_json()
        assert stored.scope_resolved_at >= run.scope_resolved_at


async def test_start_of_a_run_that_was_taken_meanwhile_raises_lease_lost(
    sqlite_url: str,
) -> None:
    with Bench(sqlite_url, look) as bench:
        claimed = await bench.claimed()
        bench.store.release(claimed.lease(), elapsed_ms=0)
        bench.store.claim_ready("rival", claimed.id)

        with pytest.raises(LeaseLost):
            await RunSession.start(bench.services, claimed)


async def test_tool_call_ids_are_unique_within_the_run_across_turns_and_sessions(
    sqlite_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"id": "same", "name": "look", "arguments": {"query": "a"}}] * 2},
        {"tool_calls": [{"id": "same", "name": "look", "arguments": {"query": "b"}}]},
    ]
    with Bench(sqlite_url, look, turns=turns) as bench:
        first = await bench.session()
        one, two = await bench.turn(first)
        for c in (one, two):
            await tool_call.first_call(first, c)
        await first.release("handed over")
        first.close()
        second = await RunSession.start(bench.services, await bench.claim(first.run.id))

        (three,) = await bench.turn(second)

        ids = [one.id, two.id, three.id]
        assert ids[0] == "same" and len(set(ids)) == 3, ids
        keys = [e.idempotency_key for e in bench.ledger(first.run.id)]
        assert keys == [f"{first.run.id}:{i}" for i in ids]


async def test_a_suspension_stores_the_pending_call_and_only_the_hash_of_its_token(
    sqlite_url: str,
) -> None:
    with Bench(sqlite_url, look, turns=[{"tool_calls": [call("look", query="a")]}]) as bench:
        session = await bench.session()
        (lookup,) = await bench.turn(session)
        args = look.validate({"query": "a"})

        stop = await suspending.suspend_turn(session, lookup, args, {"query": "a"})

        assert stop.kind is StopKind.SUSPENDED and stop.notice is not None
        token = stop.notice.token
        assert bench.notifier.notices == [stop.notice]
        assert stop.notice.approve_url.endswith(f"/approve/{token}")
        run = bench.stored(session.run.id)
        assert run.state is RunState.SUSPENDED and run.pending_token_hash == hash_token(token)
        assert run.pending is not None and run.pending.arguments == {"query": "a"}
        assert token not in json.dumps([dataclasses.asdict(run), bench.messages(run.id)])


async def test_a_decision_is_taken_once_and_only_for_its_own_call(sqlite_url: str) -> None:
    with Bench(sqlite_url, look) as bench:
        run = await bench.claimed()
        decision = Decision(
            run_id=run.id, tool_call_id="c1", decision="approve", by="boss", at=0.0, digest=None
        )
        asked = [
            {"id": c, "type": "function", "function": {"name": "look", "arguments": "{}"}}
            for c in ("c1", "c2")
        ]
        turn = [{"role": "assistant", "content": None, "tool_calls": asked}]
        answered = Decision(
            run_id=run.id, tool_call_id="c0", decision="approve", by="boss", at=0.0, digest=None
        )
        decisions = {"c1": decision, "c0": answered}  # c0: a call of an earlier turn
        session = RunSession(bench.services, run, turn, Scope(user_id="dana"), decisions=decisions)
        assert session.take_decision("c0") is None  # it has its result: never applied again

        assert session.take_decision("c2") is None  # another call's: kept
        assert session.take_decision("c1") == decision
        assert session.take_decision("c1") is None  # carried out: never applied again
        session.close()


async def test_only_the_first_call_after_a_takeover_is_recovering(sqlite_url: str) -> None:
    with Bench(sqlite_url, look) as bench:
        session = await RunSession.start(bench.services, await bench.claimed(), recovering=True)

        assert [session.take_recovering() for _ in range(3)] == [True, False, False]
        session.close()


@pytest.mark.parametrize(
    "write",
    [
        "append_turn",
        "append_result",
        "suspend",
        "halt",
        "fail",
        "release",
        "record_edit",
        "add_event",
    ],
)
async def test_every_write_of_a_session_whose_lease_was_taken_raises_and_changes_nothing(
    sqlite_url: str, write: str
) -> None:
    turns = [{"tool_calls": [call("look", query="a")]}, {"tool_calls": [call("look", query="b")]}]
    with Bench(sqlite_url, look, turns=turns) as bench:
        session = await bench.session()
        (lookup,) = await bench.turn(session)
        response = await bench.model.request(session.messages, list(bench.agent.tool_specs))
        rival = bench.take_over(session)
        stored = bench.messages(session.run.id)
        traced = bench.events(session.run.id)
        held = list(session.messages)
        writes: dict[str, Any] = {
            "append_turn": lambda: session.append_turn(session.turn_of(response)),
            "append_result": lambda: session.append_result(
                lookup, {"answer": "x"}, CallStatus.OK, counted=True
            ),
            "suspend": lambda: suspending.suspend_turn(
                session, lookup, look.validate({"query": "a"}), None
            ),
            "halt": lambda: session.halt(HaltReason.MAX_STEPS),
            "fail": lambda: session.fail(FailReason.ERROR, {"error": "boom"}),
            "release": lambda: session.release("mine no more"),
            "record_edit": lambda: session.record_edit(lookup, {"query": "z"}),
            "add_event": lambda: session.add_event("reconciled", {"tool_call_id": lookup.id}),
        }

        with pytest.raises(LeaseLost):
            await writes[write]()

        after = bench.stored(session.run.id)
        assert (after.state, after.owner, after.lease_epoch) == (
            RunState.RUNNING,
            rival.owner,
            rival.lease_epoch,
        )
        assert after.budget == rival.budget and bench.messages(session.run.id) == stored
        assert session.messages == held and bench.events(session.run.id) == traced
        assert bench.notifier.notices == []


async def test_failing_on_an_error_after_the_lease_was_taken_is_lease_lost(
    sqlite_url: str,
) -> None:
    with Bench(sqlite_url, look) as bench:
        session = await bench.session()
        bench.take_over(session)

        outcome = await session.fail_on_error(RuntimeError("boom"))

        assert outcome.kind is StopKind.LEASE_LOST
        assert bench.stored(session.run.id).state is RunState.RUNNING
