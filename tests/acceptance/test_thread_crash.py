"""Conversations with real processes (reference §14, §7): a ``tether worker`` subprocess
exits hard at a failpoint and another process goes on.

- killed between a run's end and the start of the follow-up queued behind it
  (``after_run_end``): the follow-up stays queued, and the next worker starts it, once;
- killed during a follow-up's first step (``before_model_call`` / ``after_model_call``,
  after its first messages were written): the reaper takes it over and the next worker
  answers it, with its question stored once and the conversation whole.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import inprocess
import processes
import pytest
from waiting import poll_until, run_sync

from tether.runs import RunState
from tether.store import Store

worker = processes.worker_until_idle


def test_a_worker_killed_after_a_run_ended_leaves_its_queued_follow_up_to_the_next(
    db_url: str, tmp_path: Path
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    first = run_sync(engine.start_run("dana", "q1"))
    queued = run_sync(engine.start_run("dana", "q2", thread_id=first.thread_id, if_busy="enqueue"))
    engine.close()
    store = Store(db_url)
    try:
        # One slot: no claim of this worker is in flight as the first run ends (with free
        # slots one could start the follow-up before the failpoint is reached).
        point = "after_run_end=crash"
        code = worker(db_url, tmp_path / "w1.log", "--concurrency", "1", TETHER_FAILPOINTS=point)
        assert code == 137, (tmp_path / "w1.log").read_text()
        ended, waiting = store.get_run(first.id), store.get_run(queued.id)
        assert ended is not None and ended.state is RunState.ANSWERED
        assert waiting is not None and waiting.state is RunState.QUEUED
        assert store.messages(queued.id) == []  # nothing of it was started
        assert worker(db_url, tmp_path / "w2.log") == 0, (tmp_path / "w2.log").read_text()
        done = store.get_run(queued.id)
        assert done is not None and done.state is RunState.ANSWERED, done
        assert done.lease_epoch == 1  # claimed once: never started twice
        own = store.messages(queued.id)
        assert own[0] == {"role": "user", "content": "q2"} and len(own) == 2
        record = store.thread(first.thread_id, "dana")
        assert record is not None and record.messages is not None
        assert record.messages == [*store.messages(first.id), *own]
    finally:
        store.close()


@pytest.mark.parametrize("point", ["before_model_call", "after_model_call"])
def test_a_worker_killed_in_a_follow_ups_first_step_is_recovered_with_one_question(
    db_url: str, tmp_path: Path, point: str
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    first = run_sync(engine.start_run("dana", "q1"))
    run_sync(engine.run_until_stop(first.id))
    follow = run_sync(engine.start_run("dana", "q2", thread_id=first.thread_id))
    engine.close()
    store = Store(db_url)
    try:
        code = worker(db_url, tmp_path / "w1.log", TETHER_FAILPOINTS=f"{point}=crash")
        assert code == 137, (tmp_path / "w1.log").read_text()
        crashed = store.get_run(follow.id)
        assert crashed is not None and crashed.state is RunState.RUNNING and crashed.owner
        # Its first messages were written before the model was asked.
        assert store.messages(follow.id) == [{"role": "user", "content": "q2"}]
        env = processes.tether_env(db_url, KIT_SCRIPT="answer")

        def reaped() -> bool:
            processes.tether("reap", env=env)
            current = store.get_run(follow.id)
            return current is not None and current.owner is None

        poll_until(reaped, timeout=30, what="the reaper took the orphan over")
        assert worker(db_url, tmp_path / "w2.log") == 0, (tmp_path / "w2.log").read_text()
        done = store.get_run(follow.id)
        assert done is not None and done.state is RunState.ANSWERED, done
        own = store.messages(follow.id)
        assert [m["role"] for m in own] == ["user", "assistant"]
        assert own[0] == {"role": "user", "content": "q2"}
        record = store.thread(first.thread_id, "dana")
        assert record is not None and record.messages == [*store.messages(first.id), *own]
    finally:
        store.close()


def test_twenty_concurrent_enqueued_follow_ups_run_one_at_a_time_in_order_on_two_workers(
    db_url: str, tmp_path: Path
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")

    async def accept() -> list[str]:
        first = await engine.start_run("dana", "q0")
        made = await asyncio.gather(
            *(
                engine.start_run("dana", f"q{i}", thread_id=first.thread_id, if_busy="enqueue")
                for i in range(1, 21)
            )
        )
        return [first.id, *(r.id for r in sorted(made, key=lambda r: r.thread_pos))]

    order = run_sync(accept())
    engine.close()
    environment = processes.tether_env(db_url, KIT_SCRIPT="answer")
    workers = [
        processes.spawn("worker", "--exit-when-idle", env=environment, log=tmp_path / f"w{i}.log")
        for i in range(2)
    ]
    store = Store(db_url)
    try:
        for proc in workers:
            assert proc.wait(timeout=180) == 0
        # Whatever exits first, every run is carried (a second pass if one exited early).
        states = [getattr(store.get_run(r), "state", None) for r in order]
        if any(state is not RunState.ANSWERED for state in states):
            assert worker(db_url, tmp_path / "w.log") == 0
        opened: list[int] = []
        answered: list[int] = []
        for run_id in order:
            run = store.get_run(run_id)
            assert run is not None and run.state is RunState.ANSWERED, run
            assert run.lease_epoch == 1  # started once
            events = {e.kind: e.id for e in store.events(run_id)}
            opened.append(events.get("follow_up", 0))
            answered.append(events["answered"])
        # One at a time, in the order accepted: each follow-up's first write comes after
        # the run before it answered (event ids grow with every write).
        for k in range(1, len(order)):
            assert opened[k] > answered[k - 1], (k, opened, answered)
    finally:
        store.close()
