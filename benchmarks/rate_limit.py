"""The fleet's model rate (reference §13) on PostgreSQL, with the real 60 s window.

2 ``tether worker`` processes (concurrency 50 each) share ``TETHER_MODEL_RPM`` (300 by
default) and carry 500 one-step runs whose model is ``openai:bench``: the fake OpenAI
server of the tests over HTTP, in this process, recording when each request arrived.
Printed:

- the most requests that arrived in any 60 s window (must be <= RPM);
- utilisation while work waits: a sliding-window limiter at full use starts request
  ``i + RPM`` exactly 60 s after request ``i`` (it is the first that may), so the share of
  RPM used is ``60 / (t[i + RPM] - t[i])``, median and lowest over every such ``i``
  (goal >= 90 %);
- the lease transactions per model call (``Store.lease_capacity`` calls counted in each
  worker, ``bench_agent.counted_agent``), which must be <= 1.

Run: .venv/bin/python benchmarks/rate_limit.py [--calls 500] [--rpm 300]   (about 70 s)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import throughput  # noqa: E402
from fakellm import OPENAI_PATH, Reply, openai_completion, running  # noqa: E402

WINDOW_S = 60.0


def most_in_a_window(arrivals: list[float]) -> int:
    """The most arrivals in any ``WINDOW_S`` (each arrival opening a window)."""
    times = sorted(arrivals)
    most, j = 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + WINDOW_S:
            j += 1
        most = max(most, j - i)
    return most


def measure(calls: int, rpm: int) -> None:
    name, url = throughput.fresh_database()
    try:
        eng = throughput.engine(url, "ten")
        for i in range(calls):
            eng.sync.start_run("bench", f"job {i}")
        eng.close()
        with running(OPENAI_PATH) as server, tempfile.TemporaryDirectory() as tmp:
            server.script(*(Reply(body=openai_completion(content="done")) for _ in range(calls)))
            env = throughput.worker_env(url)
            env.update(
                TETHER_MODEL="openai:bench",
                OPENAI_BASE_URL=f"{server.url}/v1",
                OPENAI_API_KEY="sk-bench",
                TETHER_MODEL_RPM=str(rpm),
            )
            counts = []
            began = time.monotonic()
            for w in range(2):  # each worker writes its own count
                counts.append(Path(tmp) / f"leases{w}.json")
            command = [
                sys.executable, "-m", "tether", "worker", "--exit-when-idle", "--no-reap",
                "--concurrency", "50", "--agent", "bench_agent:counted_agent",
            ]  # fmt: skip
            _two_workers(command, env, tmp, counts)
            took = time.monotonic() - began
            arrivals = server.arrivals()
            leases = sum(json.loads(p.read_text())["leases"] for p in counts)
        _report(calls, rpm, arrivals, leases, took)
    finally:
        throughput.drop_database(name)


def _two_workers(command: list[str], env: dict[str, str], tmp: str, counts: list[Path]) -> None:
    """Both workers to their end, each with its own lease count file."""
    import subprocess

    procs = []
    for w, path in enumerate(counts):
        own = {**env, "BENCH_LEASES_FILE": str(path)}
        log = open(Path(tmp) / f"w{w}.log", "w")
        procs.append(
            subprocess.Popen(command, env=own, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        )
    for w, proc in enumerate(procs):
        if proc.wait(timeout=600) != 0:
            raise RuntimeError((Path(tmp) / f"w{w}.log").read_text()[-2000:])


def _report(calls: int, rpm: int, arrivals: list[float], leases: int, took: float) -> None:
    times = sorted(arrivals)
    if len(times) != calls:
        raise RuntimeError(f"{len(times)} model requests arrived, not {calls}")
    most = most_in_a_window(times)
    gaps = [times[i + rpm] - times[i] for i in range(len(times) - rpm)]
    shares = [WINDOW_S / gap for gap in gaps]
    load = os.getloadavg()[0]
    print(f"rate_limit: {calls} model calls, 2 workers, TETHER_MODEL_RPM={rpm}, window 60 s")
    print(f"  load average {load:.1f}; {took:.1f} s in all")
    verdict = "PASS" if most <= rpm else "MISS"
    print(f"  most requests in any 60 s window   {most} (<= {rpm}: {verdict})")
    if shares:
        median, low = statistics.median(shares), min(shares)
        verdict = "PASS" if median >= 0.9 else "MISS"
        print(
            f"  utilisation while work waits       median {median:.1%}, lowest {low:.1%} "
            f"(>= 90%: {verdict}; over {len(shares)} requests)"
        )
    per_call = leases / calls
    verdict = "PASS" if per_call <= 1 else "MISS"
    print(f"  lease transactions per model call  {per_call:.3f} ({leases}; <= 1: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rpm", type=int, default=300)
    args = parser.parse_args()
    measure(args.calls, args.rpm)


if __name__ == "__main__":
    main()
