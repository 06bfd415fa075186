"""Workers that scale out: several processes share one database, survive a SIGKILL of
one of them, and hand runs over on SIGTERM without waiting for the heartbeat timeout."""

from __future__ import annotations

import collections
import signal
import subprocess
from pathlib import Path

import kit
import sqlalchemy as sa

from tether.store import Store
from tether.store.schema import runs


def _states(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state))
        return {str(state): int(n) for state, n in rows}


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)


def test_three_workers_carry_200_runs_through_a_sigkill(pg_url: str, tmp_path: Path) -> None:
    engine = kit.engine(pg_url, script_name="work")
    ids = [engine.sync.start_run("dana", f"job {i}").id for i in range(200)]
    engine.close()
    env = kit.tether_env(
        pg_url,
        KIT_SCRIPT="work",
        TETHER_HEARTBEAT_TIMEOUT_S="1.5",
        TETHER_REAPER_INTERVAL_S="0.5",
    )
    workers = [
        kit.spawn("worker", "--concurrency", "4", env=env, log=tmp_path / f"worker{i}.log")
        for i in range(3)
    ]
    store = Store(pg_url)
    try:
        kit.poll_until(lambda: _states(store).get("answered", 0) >= 40, timeout=120)
        workers[0].send_signal(signal.SIGKILL)
        assert workers[0].wait(timeout=30) == -signal.SIGKILL
        kit.poll_until(
            lambda: _states(store).get("answered", 0) == 200, timeout=180, what="all 200 answered"
        )
    finally:
        _stop(workers)
    assert _states(store) == {"answered": 200}
    keys = collections.Counter(key for key, tool, _ in kit.effects() if tool == "record")
    assert len(keys) == 200 and set(keys.values()) == {1}
    assert {key.split(":")[0] for key in keys} == set(ids)
    store.close()


def test_sigterm_hands_runs_over_without_waiting_for_staleness(db_url: str, tmp_path: Path) -> None:
    kit.set_world("lookup_ms", "300")
    engine = kit.engine(db_url, script_name="work")
    ids = [engine.sync.start_run("dana", f"job {i}").id for i in range(6)]
    engine.close()
    # A heartbeat timeout far longer than the test: only a handover can move the runs.
    env = kit.tether_env(db_url, KIT_SCRIPT="work", TETHER_HEARTBEAT_TIMEOUT_S="600")
    first = kit.spawn(
        "worker", "--concurrency", "6", "--no-reap", env=env, log=tmp_path / "first.log"
    )
    store = Store(db_url)
    try:
        kit.poll_until(
            lambda: all((r := store.get_run(i)) and r.owner for i in ids), what="all claimed"
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, (tmp_path / "first.log").read_text()[-2000:]
        held = [store.get_run(i) for i in ids]
        assert all(r is not None and r.owner is None for r in held), "a lease was kept"
        assert any(r is not None and r.state.value == "running" for r in held)
        second = kit.spawn(
            "worker", "--exit-when-idle", "--no-reap", env=env, log=tmp_path / "second.log"
        )
        assert second.wait(timeout=120) == 0, (tmp_path / "second.log").read_text()[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert _states(store) == {"answered": 6}
    assert sorted(tool for _, tool, _ in kit.effects()) == ["record"] * 6
    released = [e for i in ids for e in store.events(i) if e.kind == "released"]
    assert released and all(e.data["why"] == "worker stopping" for e in released)
    store.close()
