"""Several calls of one turn (reference §15) through the Python API, on both backends: one
suspension holds every confirm-needing call of the turn, each with its own token and
notice; a decision is recorded until the last one, which claims the run and carries the
turn out in order, re-checking each decided call just before it runs; the batch decides
several at once, validating all before recording any; the whole suspension expires at
once; and of many approvers racing on the turn's tokens the turn is carried out once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import downstream
import inprocess
import pytest

from tether import Engine, MemoryNotifier, StopKind
from tether.errors import AlreadyResumed, GuardFailed, InvalidInput, UnknownOrExpired
from tether.notify import Notice
from tether.results import CallVerdict
from tether.runs import RunState, run_to_json


def results(messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


@pytest.fixture
async def two_sends(db_url: str) -> Any:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="two_sends", notifier=notifier)
    try:
        yield engine, notifier
    finally:
        engine.close()


async def suspended(engine: Engine, notifier: MemoryNotifier) -> tuple[str, list[Notice]]:
    outcome = await engine.ask("dana", "send b and c")
    assert outcome.kind is StopKind.SUSPENDED
    notices = [n for n in notifier.notices if n.run_id == outcome.run_id]
    assert list(outcome.notices) == notices
    return outcome.run_id, notices


async def test_one_suspension_holds_every_confirm_needing_call_of_the_turn(
    two_sends: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = two_sends
    run_id, notices = await suspended(engine, notifier)
    view = await engine.get_run(run_id)
    calls = [c["id"] for c in view.messages[-1]["tool_calls"]]
    send_b, lookup, send_c = calls
    # One notice per pending call, each naming its call and how many the turn waits on.
    assert [(n.tool, n.tool_call_id, n.arguments, n.pending_calls) for n in notices] == [
        ("send", send_b, {"item": "b"}, 2),
        ("send", send_c, {"item": "c"}, 2),
    ]
    assert notices[0].token != notices[1].token
    assert notices[0].to_json()["pending_calls"] == 2
    data = run_to_json(view.run)
    assert data["state"] == "suspended" and data["pending"]["tool_call_id"] == send_b
    assert [
        (c["tool_call_id"], c["tool"], c["arguments"], c["decided"]) for c in data["pending_calls"]
    ] == [
        (send_b, "send", {"item": "b"}, None),
        (send_c, "send", {"item": "c"}, None),
    ]
    assert all(
        c["preview"] == {"item": c["arguments"]["item"], "price": "100"}
        for c in data["pending_calls"]
    )
    assert all(c["expires_at"] == data["pending"]["expires_at"] for c in data["pending_calls"])
    assert results(view.messages) == []  # nothing of the turn ran, the read included
    assert lookup not in {c["tool_call_id"] for c in data["pending_calls"]}
    assert downstream.effects() == []


async def test_a_decision_is_recorded_until_the_last_which_carries_the_turn_out_in_order(
    two_sends: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = two_sends
    run_id, (first, second) = await suspended(engine, notifier)
    recorded = await engine.resume_after_confirmation(first.token, "approve", "dana")
    assert (recorded.outcome, recorded.state, recorded.waiting_for) == (
        CallVerdict.RECORDED,
        RunState.SUSPENDED,
        1,
    )
    assert recorded.to_json()["outcome"] == "recorded" and recorded.to_json()["waiting_for"] == 1
    assert downstream.effects() == []  # nothing executes before the last decision
    view = await engine.get_run(run_id)
    assert view.run.state is RunState.SUSPENDED
    decided = [c.decided for c in view.run.pending_calls]
    assert decided[1] is None and decided[0] is not None
    assert (decided[0]["decision"], decided[0]["by"]) == ("approve", "dana")
    # A recorded decision is final: its token is used.
    with pytest.raises(AlreadyResumed):
        await engine.resume_after_confirmation(first.token, "decline", "dana")
    last = await engine.resume_after_confirmation(second.token, "decline", "dana", reason="not c")
    assert last.outcome is CallVerdict.DECLINED  # the last decider's own call, as carried out
    # The other call this decision carried out answers as it was carried out.
    assert [(c.tool_call_id, c.to_json()["outcome"]) for c in last.carried] == [
        (first.tool_call_id, "executed")
    ]
    assert last.to_json()["carried"][0]["outcome"] == "executed"
    await engine.run_until_stop(run_id)
    view = await engine.get_run(run_id)
    assert view.run.state is RunState.ANSWERED
    assert downstream.effects() == [(f"{run_id}:{first.tool_call_id}", "send", "b")]
    tool_results = [m for m in view.messages if m.get("role") == "tool"]
    calls = [c["id"] for c in next(m for m in view.messages if m.get("tool_calls"))["tool_calls"]]
    assert [m["tool_call_id"] for m in tool_results] == calls  # stored in call order
    sent, looked, declined = results(view.messages)
    assert sent == {"done": "send", "item": "b"} and looked["query"] == "x"
    assert declined["error"] == "declined_by_user" and declined["reason"] == "not c"
    kinds = [(e.kind, e.data.get("tool_call_id")) for e in await engine.events(run_id)]
    assert ("approved", first.tool_call_id) in kinds and ("declined", second.tool_call_id) in kinds
    with pytest.raises(AlreadyResumed):
        await engine.resume_after_confirmation(second.token, "approve", "dana")


async def test_the_batch_decides_several_calls_at_once_and_validates_all_first(
    two_sends: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = two_sends
    run_id, (first, second) = await suspended(engine, notifier)
    bad = [
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": "nope", "decision": "approve"},
        ],
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": first.tool_call_id, "decision": "decline"},
        ],
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": second.tool_call_id, "decision": "maybe"},
        ],
    ]
    for decisions in bad:
        with pytest.raises(InvalidInput):
            await engine.decide_calls(run_id, "dana", decisions)
    view = await engine.get_run(run_id)
    assert [c.decided for c in view.run.pending_calls] == [None, None]  # nothing recorded
    answers = await engine.decide_calls(
        run_id,
        "boss",
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": second.tool_call_id, "decision": "approve"},
        ],
    )
    assert [(a.tool_call_id, a.to_json()["outcome"]) for a in answers] == [
        (first.tool_call_id, "executed"),
        (second.tool_call_id, "executed"),
    ]
    await engine.run_until_stop(run_id)
    assert sorted(item for _, _, item in downstream.effects()) == ["b", "c"]
    with pytest.raises(AlreadyResumed):
        await engine.resume_after_confirmation(first.token, "approve", "dana")


async def test_each_decided_call_is_re_checked_just_before_it_runs(
    two_sends: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = two_sends
    run_id, (first, second) = await suspended(engine, notifier)
    await engine.resume_after_confirmation(first.token, "approve", "dana")
    downstream.set_world("price", "250")  # both previews change after the decisions
    waiting = await engine.resume_after_confirmation(second.token, "approve", "dana")
    # The first call changed: a new notice and token for that call alone; nothing ran, and
    # the last decider's call, not reached, waits on it (its decision stands).
    assert (waiting.outcome, waiting.waiting_for) == (CallVerdict.RECORDED, 1)
    assert downstream.effects() == []
    renewal = notifier.notices[-1]
    assert (renewal.tool_call_id, renewal.pending_calls) == (first.tool_call_id, 1)
    assert renewal.preview == {"item": "b", "price": "250"}
    view = await engine.get_run(run_id)
    assert view.run.state is RunState.SUSPENDED
    assert [c.pending.tool_call_id for c in view.run.pending_calls] == [first.tool_call_id]
    renewed = await engine.resume_after_confirmation(renewal.token, "approve", "dana")
    # The first runs on its new approval; the second's decision stands, its re-check finds
    # its preview changed too, so it waits again, alone, and the first is not undone.
    assert renewed.outcome is CallVerdict.EXECUTED and renewed.state is RunState.SUSPENDED
    assert downstream.effects() == [(f"{run_id}:{first.tool_call_id}", "send", "b")]
    view = await engine.get_run(run_id)
    assert [c.pending.tool_call_id for c in view.run.pending_calls] == [second.tool_call_id]
    assert view.run.pending_calls[0].pending.preview == {"item": "c", "price": "250"}


async def test_a_guard_that_refuses_one_call_on_re_check_keeps_what_ran_before_it(
    two_sends: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = two_sends
    run_id, (first, second) = await suspended(engine, notifier)
    await engine.resume_after_confirmation(second.token, "approve", "dana")
    downstream.set_world("hold", "1")  # the guard refuses every send from now on
    with pytest.raises(GuardFailed):  # the last decider's own call, refused on re-check
        await engine.resume_after_confirmation(first.token, "approve", "dana")
    await engine.run_until_stop(run_id)
    view = await engine.get_run(run_id)
    assert view.run.state is RunState.ANSWERED and downstream.effects() == []
    refused_b, looked, refused_c = results(view.messages)
    assert refused_b["error"] == refused_c["error"] == "guard_failed" and "query" in looked


async def test_the_whole_suspension_expires_at_once(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(
        db_url, script_name="two_sends", notifier=notifier, suspension_ttl_min=0.5 / 60
    )
    try:
        run_id, (first, second) = await suspended(engine, notifier)
        await engine.resume_after_confirmation(first.token, "approve", "dana")
        expires_at = (await engine.get_run(run_id)).run.expires_at
        assert expires_at is not None
        while await engine.now() <= expires_at:  # by the database's clock
            await asyncio.sleep(0.05)
        # A decision after the window never executes, even before the sweep halts the run.
        with pytest.raises(UnknownOrExpired):
            await engine.resume_after_confirmation(second.token, "approve", "dana")
        await engine.operator.reap()
        view = await engine.get_run(run_id)
        assert (view.run.state, view.run.halt_reason) == (RunState.HALTED, "suspension_expired")
        for notice in (first, second):  # every token of it, the recorded one included
            with pytest.raises(UnknownOrExpired):
                await engine.resume_after_confirmation(notice.token, "approve", "dana")
        assert downstream.effects() == []
    finally:
        engine.close()


async def test_ten_approvers_on_two_tokens_carry_the_turn_out_once(db_url: str) -> None:
    notifier = MemoryNotifier()
    engines = [
        inprocess.engine(db_url, script_name="two_sends", notifier=notifier) for _ in range(4)
    ]
    try:
        run_id, notices = await suspended(engines[0], notifier)
        attempts = [
            engines[i % len(engines)].resume_after_confirmation(
                notices[i % 2].token, "approve" if i % 3 else "decline", ("dana", "boss")[i % 2]
            )
            for i in range(20)
        ]
        answers = await asyncio.gather(*attempts, return_exceptions=True)
        unexpected = [
            a for a in answers if isinstance(a, BaseException) and not isinstance(a, AlreadyResumed)
        ]
        assert unexpected == []
        won = [a for a in answers if not isinstance(a, BaseException)]
        # One decision per token; exactly one of them claimed and carried the turn out.
        assert len(won) == 2
        assert sorted(a.outcome is CallVerdict.RECORDED for a in won) == [False, True]
        await engines[0].run_until_stop(run_id)
        view = await engines[0].get_run(run_id)
        assert view.run.state is RunState.ANSWERED
        keys = [key for key, _, _ in downstream.effects()]
        assert len(keys) == len(set(keys)) <= 2  # each call executed at most once
        events = await engines[0].events(run_id)
        decided = [e.data["tool_call_id"] for e in events if e.kind in ("approved", "declined")]
        assert sorted(decided) == sorted(n.tool_call_id for n in notices)
        assert len(results(view.messages)) == 3
    finally:
        for engine in engines:
            engine.close()
