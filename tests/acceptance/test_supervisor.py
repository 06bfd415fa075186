"""``tether worker --processes N``, a supervisor of worker processes: a process killed with
SIGKILL is restarted and its runs recovered once; SIGTERM hands every process's runs back
and the supervisor exits 0; under ``--exit-when-idle`` it exits with its idle processes; a
supervisor killed with SIGKILL leaves no worker behind. (That a value of ``--processes``
not accepted starts nothing is tests/unit/test_processes_option.py's.)"""

from __future__ import annotations

import collections
import os
import signal
from pathlib import Path

import downstream
import inprocess
import processes
from waiting import poll_until, run_sync

from tether import Engine, Run


def _runs(engine: Engine, ids: list[str]) -> list[Run]:
    found = [run_sync(engine.get_run(i)).run for i in ids]
    return [run for run in found if run is not None]


def _pid(worker_id: str) -> int:
    """The pid in a worker id (``host:pid:suffix``)."""
    return int(worker_id.rsplit(":", 2)[1])


def _owners(engine: Engine, ids: list[str]) -> collections.Counter[int]:
    """How many of the runs of ``ids`` each process holds, by its pid."""
    return collections.Counter(_pid(run.owner) for run in _runs(engine, ids) if run.owner)


def _started(engine: Engine, supervisor: processes.Process, count: int) -> set[int]:
    """The pids of the supervisor's ``count`` processes, once each has registered as a
    worker (so that each claims its share of the runs created next)."""

    def registered() -> set[int] | None:
        live = {_pid(worker) for worker in run_sync(engine.operator.live_workers())}
        ours = live == processes.children(supervisor.pid)
        return live if ours and len(live) == count else None

    return poll_until(registered, what=f"{count} registered processes")


def _states(engine: Engine) -> dict[str, int]:
    return {state: n for state, n in run_sync(engine.operator.counts_by_state()).items() if n}


def _recorded_once(ids: list[str]) -> None:
    keys = collections.Counter(key for key, tool, _ in downstream.effects() if tool == "record")
    assert set(keys.values()) == {1}, keys
    assert {key.split(":")[0] for key in keys} == set(ids)


def test_a_killed_process_is_restarted_and_sigterm_drains_every_process(
    pg_url: str, tmp_path: Path
) -> None:
    downstream.set_world("lookup_ms", "1000")  # the first step's read keeps each run in hand
    # Its registry reads count a worker as live as the processes' own timeout does.
    engine = inprocess.engine(pg_url, script_name="work", heartbeat_timeout_s=1)
    env = processes.tether_env(
        pg_url, KIT_SCRIPT="work", TETHER_HEARTBEAT_TIMEOUT_S="1", TETHER_REAPER_INTERVAL_S="0.3"
    )
    log = tmp_path / "supervisor.log"
    supervisor = processes.spawn(
        "worker", "--processes", "2", "--concurrency", "3", env=env, log=log
    )
    try:
        pids = _started(engine, supervisor, 2)
        first = [run_sync(engine.start_run("dana", f"job {i}")).id for i in range(6)]
        victim = poll_until(
            lambda: next(iter(_owners(engine, first)), None), what="a process holding runs"
        )
        os.kill(victim, signal.SIGKILL)
        downstream.set_world("lookup_ms", "0")  # what is recovered goes on at once
        poll_until(lambda: _states(engine) == {"answered": 6}, timeout=60, what="all answered")
        ends = [e for e in processes.log_lines(log) if e.get("pid") == victim and "signal" in e]
        assert [(e["action"], e["signal"], e["retry_in_s"]) for e in ends] == [
            ("worker_process_exit", "SIGKILL", 0.5)
        ]
        takeovers = [
            (i, _pid(e.data["owner"]))
            for i in first
            for e in run_sync(engine.events(i))
            if e.kind == "recovering"
        ]
        # Recovered by the other processes (a loaded machine may make one recover a run
        # twice, a lease lost: the effects below are what must happen once).
        assert takeovers, "no run of the killed process was recovered"
        assert victim not in {pid for _, pid in takeovers}

        # A new process took the killed one's place; SIGTERM hands every process's runs back.
        now = _started(engine, supervisor, 2)
        assert victim not in now and len(now - pids) == 1
        downstream.set_world("lookup_ms", "1000")
        second = [run_sync(engine.start_run("dana", f"task {i}")).id for i in range(6)]
        poll_until(lambda: _owners(engine, second) == dict.fromkeys(now, 3), what="3 runs each")
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert all(processes.ended(pid) for pid in now)
        held = _runs(engine, second)
        assert all(run.owner is None and run.state.value == "running" for run in held)
        stopped = [
            (e["pid"], e.get("exit_code"))
            for e in processes.log_lines(log)
            if e.get("action") == "worker_process_exit" and "retry_in_s" not in e
        ]
        assert sorted(stopped) == [(pid, 0) for pid in sorted(now)]

        # Processes that exit 0 once idle are not restarted: the supervisor exits with them.
        downstream.set_world("lookup_ms", "0")
        again = tmp_path / "again.log"
        finish = processes.spawn(
            "worker", "--processes", "2", "--exit-when-idle", env=env, log=again
        )
        assert finish.wait(timeout=120) == 0, again.read_text()[-3000:]
        assert _states(engine) == {"answered": 12}
        lines = processes.log_lines(again)
        assert not [e for e in lines if "retry_in_s" in e], "a process was restarted"
        carried = [e for e in lines if e.get("action") == "carry"]
        assert len(carried) == 6 and {e["worker_process"] for e in carried} <= {1, 2}
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        engine.close()
    _recorded_once(first + second)


def test_a_supervisor_killed_with_sigkill_leaves_no_worker_behind(
    sqlite_url: str, tmp_path: Path
) -> None:
    engine = inprocess.engine(sqlite_url)
    env = processes.tether_env(sqlite_url, TETHER_HEARTBEAT_TIMEOUT_S="600")
    log = tmp_path / "supervisor.log"
    supervisor = processes.spawn("worker", "--processes", "2", "--no-reap", env=env, log=log)
    try:
        pids = _started(engine, supervisor, 2)
        supervisor.kill()
        supervisor.wait(timeout=30)
        poll_until(lambda: all(processes.ended(pid) for pid in pids), what="its processes ended")
        # Each stopped as on SIGTERM (it left the registry), not killed (its rows would
        # stay, fresh for the heartbeat timeout).
        assert run_sync(engine.operator.live_workers()) == []
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        engine.close()
