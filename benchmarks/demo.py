"""How long ``tether demo`` takes from start to exit, as a person runs it (the quick
start's first command): each run in a new process, with no ``TETHER_*`` variable set, as
``tests/acceptance/test_demo.py`` runs it. Target: median well within a minute (60 s).

Prints the median and fastest wall-clock time of ``--repeat`` runs with PASS / MISS, and
each run's exit code; never asserts.

Run: .venv/bin/python benchmarks/demo.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 60.0


def _run() -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tether", "demo"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return time.monotonic() - started, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description="tether demo, start to exit.")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    runs = [_run() for _ in range(args.repeat)]
    times = [elapsed for elapsed, _ in runs]
    median = statistics.median(times)
    verdict = "PASS" if median < TARGET_S else "MISS"
    print(f"tether demo: median {median:.1f} s, fastest {min(times):.1f} s (target < 60 s)")
    print(f"exit codes: {[code for _, code in runs]}  {verdict}")


if __name__ == "__main__":
    main()
