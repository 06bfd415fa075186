"""How far apart a worker's reaper passes are with ``TETHER_REAPER_INTERVAL_S=1``, with
real processes, on PostgreSQL and SQLite: the scenario of the acceptance test
``tests/acceptance/test_reaper_interval.py`` (``tests/support/reaping.py``), timed.

Four orphans are left by ``tether worker`` processes killed at a failpoint, and a
suspension's notice is refused by its webhook so that it is due again at every pass. A
worker with a one-second interval and one slot then recovers the orphans (one pass takes
them all, one after another) and re-issues the notice five times. Figures, on the
database's clock:

- re-issues: from the first of the five re-issues to the last (four passes of the notices
  task; target: under 4 x 5 s, what the old PostgreSQL worker's 5 s idle wait gave);
- recoveries: from the first orphan's ``recovering`` event to the last (target: under
  3 x 5 s, three passes' worth at that floor).

Prints the median of ``--repeat`` rounds (each on a fresh database) with PASS / MISS,
never asserts.

Run: .venv/bin/python benchmarks/reaper_interval.py [--repeat 3] [--backends postgresql,sqlite]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import reaping  # noqa: E402
from throughput import drop_database, fresh_database  # noqa: E402

from tether.store import Store, upgrade  # noqa: E402

FLOOR_S = 5.0  # the interval a broken worker would fall back to


def _round(backend: str, folder: Path) -> tuple[float, float]:
    """One round on a fresh database: the re-issues' span and the recoveries' span."""
    os.environ["KIT_EFFECTS_DB"] = str(folder / "effects.db")
    name = None
    if backend == "postgresql":
        name, url = fresh_database()
    else:
        url = f"sqlite:///{folder / 'tether.db'}"
        store = Store(url)
        upgrade(store.engine)
        store.close()
    try:
        reaped = reaping.reap_with_a_one_second_interval(url, folder / "worker.log")
    finally:
        if name is not None:
            drop_database(name)
    reissues = reaped.reissues[reaping.REISSUES - 1] - reaped.reissues[0]
    return reissues, reaped.recoveries[-1] - reaped.recoveries[0]


def main() -> None:
    parser = argparse.ArgumentParser(description="A reaper's passes, one second apart.")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="postgresql,sqlite")
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    targets = {
        "re-issues": (reaping.REISSUES - 1) * FLOOR_S,
        "recoveries": (reaping.ORPHANS - 1) * FLOOR_S,
    }
    print(f"{'backend':<11} {'span':<11} {'median s':>9} {'target s':>9}  verdict")
    for backend in args.backends.split(","):
        rounds = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as folder:
                rounds.append(_round(backend, Path(folder)))
        for index, (span, target) in enumerate(targets.items()):
            median = statistics.median(r[index] for r in rounds)
            verdict = "PASS" if median < target else "MISS"
            print(f"{backend:<11} {span:<11} {median:>9.2f} {target:>9.1f}  {verdict}")


if __name__ == "__main__":
    main()
