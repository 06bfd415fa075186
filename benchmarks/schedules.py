"""Schedules fleet-wide (reference §13), on PostgreSQL: ``--schedules`` (100) schedules
``* * * * *`` due in the same minute, 3 ``tether worker`` processes racing for their
ticks: each tick must start exactly one run.

On a fresh database the schedules are added (their first tick is the next minute, by the
database's clock), then the workers are started and left through ``--ticks`` (1) ticks
and 10 s more, then stopped (SIGTERM). Read from the database: runs per schedule per tick
(target: exactly one each, none missing, none twice), and the delay from each tick to its
run's creation (median, max), on the database's clock. Figures, not assertions.

Run: .venv/bin/python benchmarks/schedules.py [--schedules 100] [--workers 3] [--ticks 1]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import sqlalchemy as sa  # noqa: E402
from throughput import (  # noqa: E402
    drop_database,
    engine,
    fresh_database,
    start_workers,
    worker_env,
)

from tether.store.sql.schema import runs, schedules  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--ticks", type=int, default=1)
    args = parser.parse_args()
    name, url = fresh_database()
    try:
        eng = engine(url, "ten")
        ids = [
            eng.sync.add_schedule("bench", "* * * * *", f"tick {i}", limits={"max_steps": 50})
            for i in range(args.schedules)
        ]
        first_tick = min(s.next_at for s in ids)
        env = worker_env(url)
        env["TETHER_REAPER_INTERVAL_S"] = "60"
        command = [sys.executable, "-m", "tether", "worker", "--agent", "bench_agent:agent"]
        with tempfile.TemporaryDirectory() as logs:
            procs = start_workers(command, env, logs, args.workers)
            last_tick = first_tick + 60 * (args.ticks - 1)
            while eng.runner.store.now() < last_tick + 10:
                time.sleep(0.5)
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
        with eng.runner.store.engine.connect() as conn:
            rows = conn.execute(
                sa.select(runs.c.schedule_id, runs.c.started_at).where(
                    runs.c.schedule_id.is_not(None)
                )
            ).all()
            fired = conn.execute(sa.select(sa.func.sum(schedules.c.fired))).scalar_one()
        eng.close()
    finally:
        drop_database(name)
    per_tick: collections.Counter[tuple[str, int]] = collections.Counter()
    delays = []
    for schedule_id, started in rows:
        tick = int((started - first_tick) // 60)
        per_tick[(schedule_id, tick)] += 1
        delays.append(started - (first_tick + 60 * tick))
    expected = args.schedules * args.ticks
    twice = sum(1 for n in per_tick.values() if n > 1)
    print(
        f"{args.schedules} schedules * * * * *, {args.workers} workers, {args.ticks} tick(s): "
        f"{len(rows)} runs for {expected} ticks (fired counted {fired}); "
        f"ticks with one run {sum(1 for n in per_tick.values() if n == 1)}, "
        f"with more {twice}, without {expected - len(per_tick)}"
    )
    if delays:
        print(
            f"tick to run: median {statistics.median(delays) * 1e3:.0f} ms, "
            f"max {max(delays) * 1e3:.0f} ms (database clock)"
        )
    print("PASS" if len(rows) == expected and twice == 0 else "MISS")


if __name__ == "__main__":
    main()
