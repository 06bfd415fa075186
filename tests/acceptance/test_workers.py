"""Workers that scale out: several processes share one database, survive a SIGKILL of
one of them, and hand runs over on SIGTERM without waiting for the heartbeat timeout."""

from __future__ import annotations

import collections
import signal
from pathlib import Path

import downstream
import inprocess
import processes
from waiting import poll_until, run_sync

from tether import Engine, Run
from tether.results import LiveEvent


def _states(engine: Engine) -> dict[str, int]:
    return {state: n for state, n in run_sync(engine.operator.counts_by_state()).items() if n}


def _run(engine: Engine, run_id: str) -> Run | None:
    return run_sync(engine.get_run(run_id)).run


def _events(engine: Engine, run_id: str) -> list[LiveEvent]:
    return run_sync(engine.events(run_id))


def _stop(procs: list[processes.Process]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)


def test_three_workers_carry_200_runs_through_a_sigkill(pg_url: str, tmp_path: Path) -> None:
    engine = inprocess.engine(pg_url, script_name="work")
    ids = [run_sync(engine.start_run("dana", f"job {i}")).id for i in range(200)]
    env = processes.tether_env(
        pg_url,
        KIT_SCRIPT="work",
        TETHER_HEARTBEAT_TIMEOUT_S="1.5",
        TETHER_REAPER_INTERVAL_S="0.5",
    )
    workers = [
        processes.spawn("worker", "--concurrency", "4", env=env, log=tmp_path / f"worker{i}.log")
        for i in range(3)
    ]
    try:
        poll_until(lambda: _states(engine).get("answered", 0) >= 40, timeout=120)
        workers[0].send_signal(signal.SIGKILL)
        assert workers[0].wait(timeout=30) == -signal.SIGKILL
        poll_until(
            lambda: _states(engine).get("answered", 0) == 200, timeout=180, what="all 200 answered"
        )
        assert _states(engine) == {"answered": 200}
    finally:
        _stop(workers)
        engine.close()
    keys = collections.Counter(key for key, tool, _ in downstream.effects() if tool == "record")
    assert len(keys) == 200 and set(keys.values()) == {1}
    assert {key.split(":")[0] for key in keys} == set(ids)


def test_sigterm_hands_runs_over_without_waiting_for_staleness(db_url: str, tmp_path: Path) -> None:
    # Long enough that all six runs are in hand at once, whatever the machine's load.
    downstream.set_world("lookup_ms", "2000")
    engine = inprocess.engine(db_url, script_name="work")
    ids = [run_sync(engine.start_run("dana", f"job {i}")).id for i in range(6)]
    # A heartbeat timeout far longer than the test: only a handover can move the runs.
    env = processes.tether_env(db_url, KIT_SCRIPT="work", TETHER_HEARTBEAT_TIMEOUT_S="600")
    first = processes.spawn(
        "worker", "--concurrency", "6", "--no-reap", env=env, log=tmp_path / "first.log"
    )
    try:
        poll_until(lambda: all((r := _run(engine, i)) and r.owner for i in ids), what="all claimed")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, (tmp_path / "first.log").read_text()[-2000:]
        held = [_run(engine, i) for i in ids]
        assert all(r is not None and r.owner is None for r in held), "a lease was kept"
        assert any(r is not None and r.state.value == "running" for r in held)
        second = processes.spawn(
            "worker", "--exit-when-idle", "--no-reap", env=env, log=tmp_path / "second.log"
        )
        assert second.wait(timeout=120) == 0, (tmp_path / "second.log").read_text()[-2000:]
        assert _states(engine) == {"answered": 6}
        released = [e for i in ids for e in _events(engine, i) if e.kind == "released"]
        assert released and all(e.data["why"] == "worker stopping" for e in released)
    finally:
        if first.poll() is None:
            first.kill()
        engine.close()
    assert sorted(tool for _, tool, _ in downstream.effects()) == ["record"] * 6
