"""Crash safety with real processes (reference §7, invariants 2, 3, 4, 8, 9).

A worker, an approval or a reaper runs as a subprocess of the ``tether`` CLI with a
failpoint that exits it hard (``os._exit(137)``); the next step is taken by another
process. After every phase the test checks the stored messages only grew (nothing lost
or rewritten) and the consumed budget never went down; at the end, that every external
write happened exactly once and the run answered.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import downstream
import heartbeats
import inprocess
import processes
import pytest
import webhooks
from waiting import poll_until

from tether.notify import MemoryNotifier
from tether.runs import Run
from tether.store import Store

STANDARD = {"record": 1, "send": 1}
TWO_SENDS = {"send": 2}
# How long a process waits for the webhook to take a notice before it counts it lost (and
# the reaper re-issues it, once a suspension is older than this): long enough that a
# loaded machine (the tiers run in parallel) delivers every notice of a live process.
NOTICE_TIMEOUT_S = 2.0


@dataclass
class Phases:
    """What the test saw between phases."""

    crashes: int = 0
    processes: list[str] = field(default_factory=list)
    messages: list[list[dict[str, object]]] = field(default_factory=list)
    budgets: list[tuple[int, float, int, int]] = field(default_factory=list)
    run_id: str = ""


def drive(
    url: str,
    run_id: str,
    failpoints: list[str],
    receiver: webhooks.NoticeReceiver,
    declined: frozenset[str] = frozenset(),
) -> Phases:
    """Carry a run to a terminal state with subprocesses, crashing at each failpoint in
    turn (the next one is armed after the previous one fired). Each notice's call is
    approved by a process of its own, one notice at a time (a turn's suspension sends one
    per call), or declined when its ``item`` is in ``declined``."""
    store = Store(url)
    seen = Phases()
    armed = list(failpoints)
    try:
        for _ in range(20):
            run = store.get_run(run_id)
            assert run is not None
            _observe(store, run, seen)
            if run.state.value in ("answered", "failed", "cancelled", "halted"):
                break
            extra = {
                "TETHER_WEBHOOK_URL": receiver.url,
                "TETHER_NOTICE_TIMEOUT_S": str(NOTICE_TIMEOUT_S),
            }
            if armed:
                extra["TETHER_FAILPOINTS"] = armed[0]
            env = processes.tether_env(url, **extra)
            notice = _notice(receiver, run_id) if run.state.value == "suspended" else None
            if notice is not None:
                receiver.notices.remove(notice)
                args = ["approve", str(notice["token"])]
                if notice["arguments"].get("item") in declined:
                    args.append("--decline")
            elif run.state.value == "suspended":
                # The notice was lost (the process died before sending it): the reaper
                # re-issues it with a fresh token once the suspension is stale.
                poll_until(
                    functools.partial(
                        _older_than, store, run.suspended_at or 0, NOTICE_TIMEOUT_S + 0.05
                    ),
                    what="an old unnotified suspension",
                )
                args = ["reap"]
            elif run.owner is None:
                args = ["worker", "--exit-when-idle", "--no-reap"]
            else:
                poll_until(
                    functools.partial(heartbeats.stale, store, run.id, unowned=True),
                    what="a stale heartbeat",
                )
                args = ["reap"]
            proc = processes.tether(*args, env=env)
            seen.processes.append(f"{args[0]}:{proc.returncode}")
            if proc.returncode == 137:
                seen.crashes += 1
                armed.pop(0)
            else:
                assert proc.returncode == 0, proc.stderr[-3000:]
        return seen
    finally:
        store.close()


def drive_script(
    url: str, script: str, failpoints: list[str], declined: frozenset[str] = frozenset()
) -> Phases:
    """Start a run of the test agent on ``script`` and ``drive`` it with subprocesses."""
    engine = inprocess.engine(url, script_name=script)
    run = engine.sync.start_run("dana", "go")
    engine.close()
    os.environ["KIT_SCRIPT"] = script
    try:
        with webhooks.receiver() as receiver:
            seen = drive(url, run.id, failpoints, receiver, declined)
    finally:
        os.environ.pop("KIT_SCRIPT", None)
    seen.run_id = run.id
    return seen


def _notice(receiver: webhooks.NoticeReceiver, run_id: str) -> dict[str, Any] | None:
    """The latest notice received for the run, if any."""
    for notice in reversed(receiver.notices):
        if notice["run_id"] == run_id:
            return notice
    return None


def _observe(store: Store, run: Run, seen: Phases) -> None:
    messages = store.messages(run.id)
    if seen.messages:
        previous = seen.messages[-1]
        assert messages[: len(previous)] == previous, "stored messages were rewritten or lost"
    seen.messages.append(messages)
    b = run.budget
    budget = (b.steps, b.spend_usd, b.tool_calls, b.elapsed_ms)
    if seen.budgets:
        assert all(now >= before for now, before in zip(budget, seen.budgets[-1], strict=True)), (
            f"consumed budget went down: {seen.budgets[-1]} -> {budget}"
        )
    seen.budgets.append(budget)


def check_messages(messages: list[dict[str, object]]) -> None:
    """Every tool call has exactly one result, right after its turn, in order."""
    asked = [
        call["id"]
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []  # type: ignore[attr-defined]
    ]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert answered == asked, f"tool results {answered} do not match calls {asked}"


def effects_by_tool() -> dict[str, int]:
    rows = downstream.effects()
    per_key = collections.Counter(key for key, _, _ in rows)
    assert all(n == 1 for n in per_key.values()), f"duplicate writes: {per_key}"
    return dict(collections.Counter(tool for _, tool, _ in rows))


CASES = [
    (["before_model_call=crash"], "standard", STANDARD),
    (["after_model_call=crash"], "standard", STANDARD),
    (["after_reads=crash"], "standard", STANDARD),
    (["after_reads:lookup=crash", "after_reads:lookup=crash"], "standard", STANDARD),
    (["after_intent=crash"], "standard", STANDARD),
    (["after_intent:record=crash"], "standard", STANDARD),
    (["before_tool_call=crash"], "standard", STANDARD),
    (["before_tool_call:record=crash"], "standard", STANDARD),
    (["after_tool_commit=crash"], "standard", STANDARD),
    (["after_tool_commit:record=crash"], "standard", STANDARD),
    (["after_step_persist:record=crash"], "standard", STANDARD),
    (["before_suspend=crash"], "standard", STANDARD),
    (["after_suspend=crash"], "standard", STANDARD),
    (["after_claim=crash"], "standard", STANDARD),
    (["after_tool_commit:send=crash"], "standard", STANDARD),
    (["after_step_persist:send=crash"], "standard", STANDARD),
    (["after_resume_execute=crash"], "standard", STANDARD),
    (["after_tool_commit:record=crash", "after_reconcile=crash"], "standard", STANDARD),
    (["after_tool_commit:write_once=crash"], "write_once", {"write_once": 1}),
    # A quorum's approval recorded and an escalation committed (reference §19) are crashed
    # at with the agent whose calls teams decide: tests/acceptance/test_decider_crash.py.
    # The run's end is durable before the gap its thread's queued successor waits in
    # (that successor's start: tests/acceptance/test_thread_crash.py).
    (["after_run_end=crash"], "standard", STANDARD),
    # Two concurrent writes and a read ran together: killed once all returned and none is
    # stored, or once the first result is stored; each write is reconciled by its key.
    (["after_tool_commit:tally=crash"], "concurrent", {"tally": 1, "stamp": 1}),
    (["after_tool_commit:stamp=crash"], "concurrent", {"tally": 1, "stamp": 1}),
    (["after_step_persist:tally=crash"], "concurrent", {"tally": 1, "stamp": 1}),
    # A turn with two sends (and a read between them): one suspension, a notice per call,
    # each decided by a process of its own (reference §15).
    (["before_suspend=crash"], "two_sends", TWO_SENDS),
    (["after_suspend=crash"], "two_sends", TWO_SENDS),
    (["after_decision_recorded=crash"], "two_sends", TWO_SENDS),
    (["after_claim=crash"], "two_sends", TWO_SENDS),
    (["after_tool_commit:send=crash"], "two_sends", TWO_SENDS),
    (["after_step_persist:send=crash", "after_step_persist:send=crash"], "two_sends", TWO_SENDS),
    (["after_resume_execute=crash"], "two_sends", TWO_SENDS),
]
# Mixed decisions on one turn: send c is declined, send b approved.
MIXED = [
    ["after_decision_recorded=crash"],
    ["after_claim=crash"],
    ["after_tool_commit:send=crash"],
]


@pytest.mark.parametrize(
    ("failpoints", "script", "expected"),
    CASES,
    ids=["+".join(c[0]) + ("" if c[1] == "standard" else f"@{c[1]}") for c in CASES],
)
def test_crash_at_each_failpoint_recovers_exactly_once(
    db_url: str, failpoints: list[str], script: str, expected: dict[str, int]
) -> None:
    seen = drive_script(db_url, script, failpoints)
    assert seen.crashes == len(failpoints), f"the failpoint never fired: {seen.processes}"
    final = seen.messages[-1]
    store = Store(db_url)
    state = store.get_run(seen.run_id)
    store.close()
    assert state is not None and state.state.value == "answered", seen.processes
    check_messages(final)
    assert effects_by_tool() == expected


@pytest.mark.parametrize("failpoints", MIXED, ids=["+".join(c) for c in MIXED])
def test_a_turn_decided_both_ways_recovers_each_decision_once(
    db_url: str, failpoints: list[str]
) -> None:
    seen = drive_script(db_url, "two_sends", failpoints, frozenset({"c"}))
    assert seen.crashes == len(failpoints), f"the failpoint never fired: {seen.processes}"
    final = seen.messages[-1]
    check_messages(final)
    results = [json.loads(str(m["content"])) for m in final if m["role"] == "tool"]
    assert results[0] == {"done": "send", "item": "b"}
    assert results[2]["error"] == "declined_by_user"
    assert [item for _, _, item in downstream.effects()] == ["b"]


def test_a_crash_after_intent_of_an_unreconciled_write_tells_the_model(db_url: str) -> None:
    """The write never ran: reconciliation finds it absent, the model is told it did not
    complete (reference invariant 3), and nothing is written twice or at all."""
    seen = drive_script(db_url, "write_once", ["after_intent=crash"])
    assert seen.crashes == 1
    check_messages(seen.messages[-1])
    results = [json.loads(str(m["content"])) for m in seen.messages[-1] if m["role"] == "tool"]
    assert results[0]["error"] == "not_completed"
    assert downstream.effects() == []


def test_a_crash_with_two_concurrent_writes_in_flight_reconciles_each_by_its_key(
    db_url: str,
) -> None:
    """Killed at ``after_tool_commit`` with both writes of a group committed downstream
    and neither result stored: the reaper, another process, reconciles each write by its
    key (the deduplicating one re-issued, the other found), never runs either again, and
    the run answers with every result in call order (reference §1, invariant 3)."""
    seen = drive_script(db_url, "concurrent", ["after_tool_commit:tally=crash"])
    assert seen.crashes == 1 and seen.processes[:2] == ["worker:137", "reap:0"], seen.processes
    # At the crash both writes had taken effect and no result of the turn was stored.
    after_crash = seen.messages[1]
    assert [m["role"] for m in after_crash][-1] == "assistant"
    final = seen.messages[-1]
    check_messages(final)
    results = [json.loads(str(m["content"])) for m in final if m["role"] == "tool"]
    assert results[0] == {"done": "tally", "item": "t"}
    assert results[1]["query"] == "q"
    assert results[2] == {"done": "stamp", "item": "s"}
    store = Store(db_url)
    try:
        state = store.get_run(seen.run_id)
        reconciled = [e.data for e in store.events(seen.run_id) if e.kind == "reconciled"]
    finally:
        store.close()
    assert state is not None and state.state.value == "answered"
    assert sorted(e["tool"] for e in reconciled) == ["stamp", "tally"]
    assert effects_by_tool() == {"tally": 1, "stamp": 1}  # each exactly once


def test_a_run_that_crashes_on_every_attempt_ends_recovery_exhausted(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    run = engine.sync.start_run("dana", "go")
    engine.close()
    with webhooks.receiver() as receiver:
        seen = drive(db_url, run.id, ["after_model_call=crash"] * 10, receiver)
    store = Store(db_url)
    final = store.get_run(run.id)
    store.close()
    assert final is not None
    assert final.state.value == "failed" and final.fail_reason == "recovery_exhausted"
    assert final.recovery_attempts == 2  # the default cap, exactly
    assert seen.crashes == 3  # the first run and its two recoveries


def test_two_reapers_at_once_recover_each_orphan_once(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    ids = [engine.sync.start_run("dana", f"go {i}").id for i in range(6)]
    engine.close()
    env = processes.tether_env(db_url, TETHER_FAILPOINTS="after_tool_commit:record=crash")
    for _ in ids:
        crashed = processes.tether(
            "worker", "--exit-when-idle", "--no-reap", "--concurrency", "1", env=env
        )
        assert crashed.returncode == 137, crashed.stderr[-2000:]
    store = Store(db_url)

    # The reapers judge staleness by 3 s, not the 0.3 s the crashed workers had: a reaper
    # slowed down by a loaded machine while it recovers a run must not look dead to the
    # other one (that would be a second, legitimate, recovery of a run it took over).
    def stale_for_reapers() -> bool:
        now = store.now()
        return all(now - (getattr(store.get_run(i), "heartbeat_at", 0) or 0) > 3.05 for i in ids)

    poll_until(stale_for_reapers, timeout=30, what="orphans stale by the reapers' 3 s")
    reap_env = processes.tether_env(db_url, TETHER_HEARTBEAT_TIMEOUT_S="3")
    reapers = [processes.start("reap", env=reap_env) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in reapers]
    assert all(p.returncode == 0 for p in reapers), outputs
    recovered = [json.loads(out)["recovered"] for out, _ in outputs]
    assert sorted(recovered[0] + recovered[1]) == sorted(ids)
    assert not set(recovered[0]) & set(recovered[1])
    for run_id in ids:
        run = store.get_run(run_id)
        assert run is not None and run.recovery_attempts == 1
    store.close()
    assert effects_by_tool() == {"record": 6}


def test_a_paused_worker_cannot_write_after_the_reaper_took_its_run(db_url: str) -> None:
    downstream.set_world("lookup_ms", "1500")
    engine = inprocess.engine(db_url, script_name="standard")
    run = engine.sync.start_run("dana", "go")
    engine.close()
    store = Store(db_url)
    with webhooks.receiver() as receiver:
        env = processes.tether_env(db_url, TETHER_WEBHOOK_URL=receiver.url)
        worker = processes.start("worker", "--exit-when-idle", "--no-reap", env=env)
        try:
            working = Path(os.environ["KIT_EFFECTS_DB"] + ".working")
            poll_until(working.exists, what="the first tool at work")
            processes.pause_outside_a_write(worker, db_url)
            poll_until(
                lambda: heartbeats.stale(store, run.id, unowned=True), what="a stale heartbeat"
            )
            epoch_before = store.get_run(run.id).lease_epoch  # type: ignore[union-attr]
            reap = processes.tether("reap", env=env)
            assert reap.returncode == 0, reap.stderr
            assert store.get_run(run.id).lease_epoch == epoch_before + 1  # type: ignore[union-attr]
            downstream.set_world("lookup_ms", "0")
        finally:
            worker.send_signal(signal.SIGCONT)
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0
        assert "lease lost" in stderr  # its late write was refused by the store
        drive(db_url, run.id, [], receiver)
    messages = store.messages(run.id)
    store.close()
    check_messages(messages)
    assert effects_by_tool() == STANDARD


def test_twenty_approvals_from_separate_processes_resume_once(pg_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(pg_url, script_name="send", notifier=notifier)
    outcome = engine.sync.ask("dana", "send")
    token = notifier.last(outcome.run_id).token
    engine.close()
    env = processes.tether_env(pg_url)
    procs = [processes.start("approve", token, env=env) for _ in range(20)]
    results = [(p.communicate(timeout=180), p.returncode) for p in procs]
    codes = [code for _, code in results]
    assert codes.count(0) == 1, results
    assert codes.count(1) == 19
    refused = [err for (_, err), code in results if code == 1]
    assert all("already_resumed" in err for err in refused)
    assert effects_by_tool() == {"send": 1}


def _older_than(store: Store, since: float, seconds: float) -> bool:
    return store.now() - since > seconds
