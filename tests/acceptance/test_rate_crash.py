"""The fleet's model rate with real processes (reference §13, §7): a ``tether worker`` dies
holding model capacity (``after_rate_lease``: the slot leased, the model not called) and
another worker process recovers the run, which gets capacity again once the dead worker's
lease has left the window, and answers. Nothing waits forever for a slot nobody gives back.
"""

from __future__ import annotations

import functools
from pathlib import Path

import inprocess
import processes
import sqlalchemy as sa
from waiting import poll_until, run_sync

from tether.runs import RunState
from tether.store import Store
from tether.store.sql.schema import model_usage

WINDOW_S = 3.0
VALID_S = 1.0  # rate_limit.VALID_S


def worker(url: str, log: Path, **env: str) -> int:
    """Run a ``tether worker`` (RPM 1 in a short window) until it is idle, or a failpoint
    exits it; its exit code."""
    limited = {"TETHER_MODEL_RPM": "1", "TETHER_MODEL_RATE_WINDOW_S": str(WINDOW_S)}
    return processes.worker_until_idle(url, log, **limited, **env)


def leases(store: Store) -> list[tuple[float, int]]:
    with store.engine.connect() as conn:
        query = sa.select(model_usage.c.at, model_usage.c.requests).order_by(model_usage.c.at)
        return [(float(at), int(n)) for at, n in conn.execute(query) if n > 0]


def stale(store: Store, run_id: str) -> bool:
    run = store.get_run(run_id)
    assert run is not None
    return store.now() - (run.heartbeat_at or 0) > 0.35  # tether_env's heartbeat: 0.3 s


def test_a_worker_killed_holding_capacity_delays_the_run_only_until_the_window_passes(
    db_url: str, tmp_path: Path
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    run_id = run_sync(engine.start_run("dana", "q")).id
    engine.close()
    store = Store(db_url)
    try:
        code = worker(db_url, tmp_path / "w1.log", TETHER_FAILPOINTS="after_rate_lease=crash")
        assert code == 137, (tmp_path / "w1.log").read_text()
        crashed = store.get_run(run_id)
        assert crashed is not None and crashed.state is RunState.RUNNING and crashed.owner
        ((held_at, held),) = leases(store)  # the slot died with its worker, never given back
        assert held == 1
        poll_until(functools.partial(stale, store, run_id), what="a stale heartbeat")

        assert worker(db_url, tmp_path / "w2.log") == 0, (tmp_path / "w2.log").read_text()

        done = store.get_run(run_id)
        assert done is not None and done.state is RunState.ANSWERED, done
        assert done.recovery_attempts == 1 and done.model_failures == 0
        first, second = leases(store)
        assert first == (held_at, 1) and second[1] == 1
        # The dead worker's slot may have been used: it counted until it left the window.
        assert second[0] >= held_at + WINDOW_S + VALID_S
        waits = [e for e in store.events(run_id) if e.kind == "rate_limited"]
        assert len(waits) <= 1
    finally:
        store.close()
