"""The three resumptions, expiry, retention and cancel, in-process on both backends.
Crash safety with real processes is in tests/acceptance."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from typing import Any

import downstream
import inprocess
import pytest
from waiting import until

from tether import ApprovalResult, Engine, MemoryNotifier, Run, StopKind
from tether.errors import (
    AlreadyFinished,
    AlreadyResumed,
    Changed,
    GuardFailed,
    NoLongerPermitted,
    NotFound,
    NotHalted,
    TetherError,
    UnknownOrExpired,
)
from tether.store import Store


async def _suspended(url: str, script: str = "send", **settings: Any) -> tuple[Engine, str, str]:
    notifier = MemoryNotifier()
    engine = inprocess.engine(url, script_name=script, notifier=notifier, **settings)
    outcome = await engine.ask("dana", "send b")
    assert outcome.kind is StopKind.SUSPENDED
    return engine, outcome.run_id, notifier.last(outcome.run_id).token


def _run(engine: Engine, run_id: str) -> Run:
    run = engine.runner.store.get_run(run_id)
    assert run is not None
    return run


def _past(store: Store, deadline: float) -> bool:
    return store.now() > deadline


def _tool_results(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    return [json.loads(str(m["content"])) for m in messages if m["role"] == "tool"]


async def test_approval_executes_once_and_the_run_keeps_its_spent_budget(db_url: str) -> None:
    engine, run_id, token = await _suspended(db_url)
    before = (await engine.get_run(run_id)).run.budget
    assert before.spend_usd > 0
    result = await engine.resume_after_confirmation(token, "approve", "dana")
    assert result.ok and result.outcome == "executed"
    after = (await engine.get_run(run_id)).run.budget
    # An approval runs the tool and asks the model nothing: no step, no spend.
    assert after.spend_usd == before.spend_usd and after.steps == before.steps
    assert after.tool_calls == before.tool_calls + 1
    final = await engine.run_until_stop(run_id)
    assert final.kind is StopKind.ANSWERED
    assert [e[1] for e in downstream.effects()] == ["send"]
    engine.close()


async def test_twenty_concurrent_approvals_from_threads_resume_once(db_url: str) -> None:
    engine, _, token = await _suspended(db_url)
    engine.close()
    results: list[ApprovalResult | TetherError] = []
    barrier = threading.Barrier(20)

    def approve() -> None:
        own = inprocess.engine(db_url, script_name="send")
        barrier.wait()
        try:
            results.append(own.sync.resume_after_confirmation(token, "approve", "dana"))
        except TetherError as exc:
            results.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=approve) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    oks = [r for r in results if not isinstance(r, TetherError)]
    losers = [r for r in results if isinstance(r, TetherError)]
    assert len(results) == 20 and len(oks) == 1
    assert {type(r) for r in losers} == {AlreadyResumed}
    assert all(r.details["decision"]["decision"] == "approve" for r in losers)
    assert len(downstream.effects()) == 1


async def test_decline_becomes_the_tool_result_and_nothing_is_sent(db_url: str) -> None:
    engine, run_id, token = await _suspended(db_url)
    result = await engine.resume_after_confirmation(token, "decline", "dana")
    assert result.ok and result.decision == "decline"
    assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
    results = _tool_results((await engine.get_run(run_id)).messages)
    assert results[-1]["error"] == "declined_by_user"
    assert downstream.effects() == []
    engine.close()


async def test_revoked_permission_halts_with_no_longer_permitted(db_url: str) -> None:
    engine, run_id, token = await _suspended(db_url)
    downstream.set_world("perm:dana", "0")
    with pytest.raises(NoLongerPermitted):
        await engine.resume_after_confirmation(token, "approve", "dana")
    run = (await engine.get_run(run_id)).run
    assert run.state.value == "halted" and run.halt_reason == "no_longer_permitted"
    assert _tool_results((await engine.get_run(run_id)).messages)[-1]["error"] == (
        "no_longer_permitted"
    )
    assert downstream.effects() == []
    with pytest.raises(AlreadyResumed):  # the token was used by the claim
        await engine.resume_after_confirmation(token, "approve", "dana")
    engine.close()


async def test_a_changed_preview_is_refused_with_a_diff_and_a_working_new_token(
    db_url: str,
) -> None:
    engine, run_id, token = await _suspended(db_url)
    downstream.set_world("price", "90")
    with pytest.raises(Changed) as changed:
        await engine.resume_after_confirmation(token, "approve", "dana")
    assert changed.value.details["diff"] == [{"path": "price", "before": "100", "after": "90"}]
    new_token = changed.value.details["token"]
    assert new_token != token
    run = (await engine.get_run(run_id)).run
    assert run.state.value == "suspended" and run.pending is not None
    assert run.pending.preview == {"item": "b", "price": "90"}
    assert downstream.effects() == []
    result = await engine.resume_after_confirmation(new_token, "approve", "dana")
    assert result.ok
    assert len(downstream.effects()) == 1
    engine.close()


async def test_a_guard_refusal_becomes_the_tool_result_and_the_run_goes_on(db_url: str) -> None:
    engine, run_id, token = await _suspended(db_url)
    downstream.set_world("hold", "1")
    with pytest.raises(GuardFailed, match="on hold"):
        await engine.resume_after_confirmation(token, "approve", "dana")
    assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
    assert _tool_results((await engine.get_run(run_id)).messages)[-1]["error"] == "guard_failed"
    assert downstream.effects() == []
    engine.close()


async def test_tokens_are_unknown_to_strangers_and_to_nobody(db_url: str) -> None:
    engine, run_id, token = await _suspended(db_url)
    with pytest.raises(UnknownOrExpired):
        await engine.resume_after_confirmation("not-a-token", "approve", "dana")
    with pytest.raises(UnknownOrExpired):
        await engine.resume_after_confirmation(token, "approve", "mallory")
    assert (await engine.get_run(run_id)).run.state.value == "suspended"
    result = await engine.resume_after_confirmation(token, "approve", "boss")  # a scope approver
    assert result.ok
    with pytest.raises(UnknownOrExpired):  # a used token still reveals nothing to a stranger
        await engine.resume_after_confirmation(token, "approve", "mallory")
    engine.close()


async def test_an_expired_suspension_halts_and_its_token_stops_working(db_url: str) -> None:
    engine, run_id, token = await _suspended(db_url, suspension_ttl_min=0.002)
    expires_at = _run(engine, run_id).expires_at or 0
    await until(lambda: engine.runner.store.now() > expires_at)
    assert engine.runner.store.open_suspensions(10)[0] == []  # past its window, swept or not
    # The claim checks the window itself, even before the sweep ran.
    with pytest.raises(UnknownOrExpired):
        await engine.resume_after_confirmation(token, "approve", "dana")
    assert await engine.runner.expire_suspended() == [run_id]
    run = (await engine.get_run(run_id)).run
    assert run.state.value == "halted" and run.halt_reason == "suspension_expired"
    with pytest.raises(UnknownOrExpired):
        await engine.resume_after_confirmation(token, "approve", "dana")
    assert downstream.effects() == []
    engine.close()


async def test_an_approval_racing_the_expiry_sweep_is_decided_once(db_url: str) -> None:
    for _ in range(5):
        engine, run_id, token = await _suspended(db_url, suspension_ttl_min=0.003)
        try:
            deadline = (_run(engine, run_id).expires_at or 0) - 0.05
            await until(functools.partial(_past, engine.runner.store, deadline))
            approval, expired = await asyncio.gather(
                engine.resume_after_confirmation(token, "approve", "dana"),
                engine.runner.expire_suspended(),
                return_exceptions=True,
            )
            run = (await engine.get_run(run_id)).run
            if isinstance(approval, BaseException):
                assert isinstance(approval, UnknownOrExpired)
                # The sweep may have looked just before the window closed and the claim
                # just after: the run then stays suspended until the next sweep halts it.
                # Either way it never ran.
                assert run.state.value in {"halted", "suspended"} and downstream.effects() == []
                if run.state.value == "suspended":
                    assert expired == []
                    assert await engine.runner.expire_suspended() == [run_id]
                else:
                    assert expired == [run_id]
                run = (await engine.get_run(run_id)).run
                assert run.halt_reason == "suspension_expired" and downstream.effects() == []
            else:
                assert expired == [] and run.state.value == "running"
                assert len(downstream.effects()) == 1
        finally:
            engine.close()
            downstream.effects_reset()


async def test_continue_is_deliberate_logged_and_never_reruns_a_tool(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    outcome = await engine.ask("dana", "go", limits={"max_steps": 2})
    assert outcome.kind is StopKind.HALTED and outcome.reason == "max_steps"
    before = (await engine.get_run(outcome.run_id)).run
    effects_before = downstream.effects()
    with pytest.raises(NotFound):
        await engine.continue_run(outcome.run_id, "mallory")
    with pytest.raises(NotFound):
        await engine.continue_run("no-such-run", "dana")
    continued = await engine.continue_run(outcome.run_id, "dana", why="needs one more step")
    assert continued.limits.max_steps == 6
    assert continued.budget == before.budget
    with pytest.raises(NotHalted):
        await engine.continue_run(outcome.run_id, "dana")
    event = [e for e in await engine.events(outcome.run_id) if e.kind == "continued"][-1]
    assert event.data["by"] == "dana" and event.data["previous_halt_reason"] == "max_steps"
    assert event.data["old_limits"]["max_steps"] == 2 and event.data["new_limits"]["max_steps"] == 6
    assert (await engine.run_until_stop(outcome.run_id)).kind is StopKind.SUSPENDED
    assert downstream.effects() == effects_before
    ids = [entry.tool_call_id for entry in await engine.ledger(outcome.run_id)]
    assert len(ids) == len(set(ids))
    engine.close()


async def test_cancel_only_by_the_owner_and_only_once(db_url: str) -> None:
    engine, run_id, _ = await _suspended(db_url)
    with pytest.raises(NotFound):
        await engine.cancel_run(run_id, "mallory")
    cancelled = await engine.cancel_run(run_id, "dana")
    assert cancelled.state.value == "cancelled"
    with pytest.raises(AlreadyFinished):
        await engine.cancel_run(run_id, "dana")
    engine.close()


async def test_purge_deletes_old_finished_runs_with_their_rows(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="answer", retention_days=0.00000001)
    outcome = await engine.ask("dana", "hi")
    live, _, _ = await _suspended(db_url)
    updated_at = _run(engine, outcome.run_id).updated_at
    await until(lambda: engine.runner.store.now() - updated_at > 0.01)
    assert await engine.runner.purge_retained() == 1
    with pytest.raises(NotFound):
        await engine.get_run(outcome.run_id)
    assert engine.runner.store.events(outcome.run_id) == []
    assert len(await engine.list_runs()) == 1  # the suspended run is kept
    engine.close()
    live.close()


@pytest.mark.parametrize(
    ("script", "failure", "expect"),
    [
        ("write_once", "after_commit", ("answered", 1, None)),
        ("write_once", "before_commit", ("answered", 0, "not_completed")),
        ("blind", "after_commit", ("failed", 1, None)),
    ],
)
async def test_an_ambiguous_write_is_reconciled_before_the_loop_goes_on(
    db_url: str, script: str, failure: str, expect: tuple[str, int, str | None]
) -> None:
    state, effects, error = expect
    downstream.inject_failure({"write_once": "write_once", "blind": "blind_write"}[script], failure)
    engine = inprocess.engine(db_url, script_name=script)
    outcome = await engine.ask("dana", "write")
    run = (await engine.get_run(outcome.run_id)).run
    assert run.state.value == state
    assert len(downstream.effects()) == effects
    if state == "failed":
        assert run.fail_reason == "unreconcilable"
        ledger = await engine.ledger(outcome.run_id)
        assert ledger[0].status.value == "unknown"
    else:
        results = _tool_results((await engine.get_run(outcome.run_id)).messages)
        assert results[0].get("error") == error
    engine.close()


async def test_deciding_from_the_inbox_by_run_claims_once_and_checks_the_digest(
    db_url: str,
) -> None:
    engine, run_id, _ = await _suspended(db_url)
    run = (await engine.get_run(run_id)).run
    assert run.pending is not None
    call, shown = run.pending.tool_call_id, run.pending.digest
    with pytest.raises(UnknownOrExpired):
        await engine.web.resume_by_run(
            run_id, "approve", "mallory", tool_call_id=call, shown_digest=shown
        )
    with pytest.raises(UnknownOrExpired):  # a digest the approver was never shown
        await engine.web.resume_by_run(
            run_id, "approve", "dana", tool_call_id=call, shown_digest="0" * 64
        )
    results = await asyncio.gather(
        *[
            engine.web.resume_by_run(
                run_id, "approve", "dana", tool_call_id=call, shown_digest=shown
            )
            for _ in range(5)
        ],
        return_exceptions=True,
    )
    assert sum(1 for r in results if not isinstance(r, BaseException)) == 1
    assert all(isinstance(r, AlreadyResumed) for r in results if isinstance(r, BaseException))
    assert len(downstream.effects()) == 1
    engine.close()


async def test_an_inbox_click_on_a_preview_that_changed_does_not_approve_the_new_one(
    db_url: str,
) -> None:
    engine, run_id, token = await _suspended(db_url)
    run = (await engine.get_run(run_id)).run
    assert run.pending is not None
    call, shown = run.pending.tool_call_id, run.pending.digest
    downstream.set_world("price", "90")
    with pytest.raises(Changed):
        await engine.resume_after_confirmation(token, "approve", "dana")
    with pytest.raises(AlreadyResumed):  # the old page's click: the approval it carried is used
        await engine.web.resume_by_run(
            run_id, "approve", "dana", tool_call_id=call, shown_digest=shown
        )
    assert (await engine.get_run(run_id)).run.state.value == "suspended"
    assert downstream.effects() == []
    engine.close()
