"""Live event watchers against busy workers, on PostgreSQL (reference §11).

``--runs`` (default 400) scripted 10-step runs are carried by 2 ``tether worker`` processes
(concurrency 8 each) on a fresh database, timed on the database's clock from the first
step to the last answer, as ``throughput.py`` does. Each round does this twice on fresh
databases, in alternating order: with no watchers, and with ``--watchers`` (default 100)
``engine.watch`` streams in one other process (one engine, as one API process serves its
SSE clients: one LISTEN connection, a read per wake-up per watcher). Watcher k follows
runs k, k + W, k + 2W, … in turn (the workers take the oldest first), so about W watchers
follow queued or running runs for the whole window. Every event of every run must reach
its watcher exactly once, in SEQ order (checked against the store).

A third setup has no watchers and workers whose store announces nothing: what sending the
notices (``tether.store.backend.announce``) costs the workers.

Printed: runs/s without and with watchers (medians over ``--repeat`` rounds) and their
ratio; the watchers' delivery lag (local clock at delivery minus the event's stored time,
same machine; ``created`` events, stored before their watcher reached the run, are not
counted), median and p99. Figures are printed, never asserted.

Run: .venv/bin/python benchmarks/watchers.py [--runs 400] [--watchers 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402

from tether import Engine  # noqa: E402

WORKERS = 2


def _watch_role(url: str, ids_file: str, watchers: int, out_file: str) -> None:
    """The watcher process: follow the runs of ``ids_file``; write lags and counts."""
    ids: list[str] = json.loads(Path(ids_file).read_text())
    eng = throughput.engine(url, "ten")
    lags: list[float] = []
    seen: dict[str, list[int]] = {}

    async def follow(k: int) -> None:
        for run_id in ids[k::watchers]:
            async for event in eng.watch(run_id):
                if event.kind != "created":  # written before its watcher got to the run
                    lags.append(time.time() - event.at)
                seen.setdefault(run_id, []).append(event.seq)

    async def main() -> None:
        await asyncio.gather(*(follow(k) for k in range(watchers)))

    Path(out_file + ".ready").touch()
    asyncio.run(main())
    eng.close()
    Path(out_file).write_text(json.dumps({"lags": lags, "seen": seen}))


def _round(count: int, watchers: int, *, notices: bool = True) -> tuple[float, list[float]]:
    """(runs/s, delivery lags) for one fresh database, with ``watchers`` or none; without
    ``notices`` the workers announce no events (what announcing costs them)."""
    name, url = throughput.fresh_database()
    try:
        eng = throughput.engine(url, "ten")
        limits = {"max_steps": 50, "max_tool_calls": 50}
        ids = [eng.sync.start_run("bench", f"job {i}", limits=limits).id for i in range(count)]
        with tempfile.TemporaryDirectory() as tmp:
            watcher, out = None, ""
            if watchers:
                watcher, out = throughput.start_watchers(__file__, url, ids, watchers, tmp)
            rate, _ = _carry(url, count, tmp, notices=notices)
            lags: list[float] = []
            if watcher is not None:
                if watcher.wait(timeout=600) != 0:
                    raise RuntimeError("the watcher process failed")
                watched = json.loads(Path(out).read_text())
                _check(eng, ids, watched["seen"])
                lags = watched["lags"]
        eng.close()
        return rate, lags
    finally:
        throughput.drop_database(name)


# A worker process whose store announces nothing: the baseline of what announcing costs.
_SILENT = (
    "import tether.store.backend.announce as a; a.Announcer.announce = lambda self, ids: None; "
    "from tether.cli.app import main; main()"
)


def _carry(url: str, count: int, tmp: str, *, notices: bool) -> tuple[float, float]:
    """Carry the runs with the worker processes; (runs/s, seconds) on the DB clock."""
    start = ["-m", "tether"] if notices else ["-c", _SILENT]
    command = [sys.executable, *start, "worker", "--exit-when-idle", "--no-reap"]
    command += ["--concurrency", "8", "--agent", "bench_agent:agent"]
    throughput.run_workers(command, throughput.worker_env(url), tmp, WORKERS, timeout=600)
    eng = throughput.engine(url, "ten")
    try:
        return throughput.carried(eng, count)
    finally:
        eng.close()


def _check(eng: Engine, ids: list[str], seen: dict[str, list[int]]) -> None:
    for run_id in ids:
        stored = len(eng.runner.store.events(run_id))
        if seen.get(run_id) != list(range(1, stored + 1)):
            raise RuntimeError(f"run {run_id}: watched {seen.get(run_id)}, stored {stored}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--watch-role":
        url, ids_file, count, out = sys.argv[2:]
        _watch_role(url, ids_file, int(count), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"silent": [], "bare": [], "watched": []}
    lags: list[float] = []
    setups = [("silent", 0, False), ("bare", 0, True), ("watched", args.watchers, True)]
    for i in range(args.repeat):
        for label, watchers, notices in setups if i % 2 == 0 else setups[::-1]:
            rate, round_lags = _round(args.runs, watchers, notices=notices)
            rates[label].append(rate)
            lags += round_lags
            print(f"round {i + 1}, {label:>7}: {rate:.1f} runs/s", flush=True)
    load = os.getloadavg()[0]
    silent, without, with_ = (statistics.median(rates[k]) for k in ("silent", "bare", "watched"))
    print(f"\n{args.runs} runs x 10 steps, {WORKERS} workers x 8; load average {load:.2f}")
    print(f"  runs/s, no notices, no watchers: {silent:.1f}")
    print(f"  runs/s, notices, no watchers: {without:.1f} ({without / silent:.2f}x)")
    print(f"  runs/s, notices, {args.watchers} watchers: {with_:.1f} ({with_ / without:.2f}x)")
    ordered = sorted(lags)
    p99 = ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan")
    median = statistics.median(ordered) if ordered else float("nan")
    print(f"  delivery lag: median {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
    print(f"  events delivered: {len(lags)} (each exactly once, in order: checked)")


if __name__ == "__main__":
    main()
