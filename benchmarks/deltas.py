"""The model's text as it is written (reference §16), on PostgreSQL.

The workers' model (``bench_agent.TimedText``) writes 10 turns per run (9 ``fetch`` calls,
then the answer), each of ``--pieces`` pieces; a piece starts with the wall-clock time it
was written, so a watcher can tell each piece's lag.

0. What a notice costs PostgreSQL, before choosing NOTIFY to carry deltas: one
   ``pg_notify`` per transaction, 100 per transaction (how the announcer batches), and a
   one-row INSERT commit (what a durable write of each piece would cost instead).
1. Workers' runs/s: ``--runs`` runs carried by 2 ``tether worker`` processes (concurrency
   8) on a fresh database, the pieces as fast as the process takes them (a bare yield
   between two), in four setups per round (alternating order): streaming off (each
   turn's text in one piece once whole), streaming on with no watchers, and streaming on
   with ``--watchers`` watchers in one other process (watcher k follows runs k, k + W,
   ...), of the stored events only (``engine.watch``), then with deltas
   (``deltas=True``). On the database's clock, from the first step to the last
   answer, as ``throughput.py``; and the CPU time per run of the worker processes and of
   the watchers' process (all on the same 2 cores as PostgreSQL).
2. Delta lag from the model's piece to a watcher in another process: the same watchers,
   the pieces paced ``--delay`` s apart as a provider's stream comes; each live piece's
   arrival minus its written time (a catch-up's old text is not counted). Median, p99.
3. A worker's memory with ``--watchers`` stalled watchers: one process carries
   ``--memory-runs`` runs (in-process ``Worker``, concurrency 8) with turns of 8,000
   characters, while ``--watchers`` watchers of its first runs took one event and never
   read again; its RSS after each tenth of the runs.

Every watcher's deltas are checked: a step's deltas follow each other from offset 0
without gap or overlap (a delta at 0 starts it again), all before that step's
``model_turn``, and their text is that event's text (a gap or a text that differs is an
error). A step whose deltas were only the start of its text when its ``model_turn`` came
(its last deltas had not come: reference §16 forbids it) is counted and printed with parts
1 and 2. Figures are printed, never asserted.

Run: .venv/bin/python benchmarks/deltas.py [--runs 300] [--watchers 100] [--repeat 3]
     [--pieces 20] [--delay 0.02] [--memory-runs 1000] [--only notify|rate|lag|memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_agent  # noqa: E402
import throughput  # noqa: E402

from tether import Engine, MemoryNotifier  # noqa: E402
from tether.config import Settings  # noqa: E402
from tether.results import Delta  # noqa: E402

WORKERS = 2


def _engine(url: str) -> Engine:
    return Engine(
        agent=bench_agent.text_agent(),
        model=bench_agent.TimedText(),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )


def _env(url: str, **extra: str) -> dict[str, str]:
    env = throughput.worker_env(url)
    env.update(extra)
    return env


# -- 0. what a notice costs ----------------------------------------------------------------


def notify_cost(count: int = 3000) -> None:
    name, url = throughput.fresh_database()
    payload = "x" * 120
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE pieces (id bigserial PRIMARY KEY, body text)")
            figures = {}
            start = time.perf_counter()
            for _ in range(count):
                conn.execute("SELECT pg_notify('bench', %s)", (payload,))
            figures["1 notice per transaction"] = (time.perf_counter() - start) / count
            batch = "SELECT pg_notify('bench', p) FROM unnest(%s::text[]) AS t(p)"
            start = time.perf_counter()
            for _ in range(count // 100):
                conn.execute(batch, ([payload] * 100,))
            figures["100 notices per transaction"] = (time.perf_counter() - start) / count
            start = time.perf_counter()
            for _ in range(count):
                conn.execute("INSERT INTO pieces (body) VALUES (%s)", (payload,))
            figures["1 durable row per transaction"] = (time.perf_counter() - start) / count
    finally:
        throughput.drop_database(name)
    print(f"\n0. cost per piece on PostgreSQL ({count} pieces of 120 bytes, one connection)")
    for label, seconds in figures.items():
        print(f"  {label}: {seconds * 1e6:.0f} µs")


# -- the watcher process -----------------------------------------------------------------------


def _watch_role(url: str, ids_file: str, watchers: int, out_file: str, deltas: bool) -> None:
    """Follow the runs of ``ids_file`` (with deltas unless told otherwise); write the lags
    and what was seen."""
    ids: list[str] = json.loads(Path(ids_file).read_text())
    eng = _engine(url)
    lags: list[float] = []
    texts: dict[str, dict[str, str]] = {}  # run -> step -> text from its deltas
    stored: dict[str, dict[str, str]] = {}  # run -> step -> model_turn text
    at_turn: dict[str, dict[str, str]] = {}  # run -> step -> deltas' text at its model_turn
    problems: list[str] = []

    async def follow(k: int) -> None:
        for run_id in ids[k::watchers]:
            held = texts.setdefault(run_id, {})
            async for item in eng.watch(run_id, deltas=deltas):
                if isinstance(item, Delta):
                    now = time.time()
                    step = str(item.step)
                    before = "" if item.offset == 0 else held.get(step, "")
                    if len(before) != item.offset:
                        problems.append(f"{run_id} step {step}: gap at {item.offset}")
                    held[step] = before + item.text
                    if not item.catch_up:  # whole pieces (a notice may split one)
                        pieces = item.text.split(";")
                        lags.extend(now - float(p[:17]) for p in pieces if len(p) == 23)
                elif item.kind == "model_turn":
                    step = str(item.data["step"])
                    stored.setdefault(run_id, {})[step] = item.data["text"]
                    if step in held:
                        at_turn.setdefault(run_id, {})[step] = held[step]

    async def main() -> None:
        await asyncio.gather(*(follow(k) for k in range(watchers)))

    Path(out_file + ".ready").touch()
    asyncio.run(main())
    eng.close()
    short = 0
    for run_id, steps in texts.items():
        for step, text in steps.items():
            whole = stored.get(run_id, {}).get(step, "")
            if not whole.startswith(text) or text != at_turn.get(run_id, {}).get(step):
                problems.append(f"{run_id} step {step}: deltas differ from the stored text")
            elif text != whole:  # a delta after its model_turn is never sent: the tail came late
                short += 1
    count = sum(len(steps) for steps in texts.values())
    found = {"lags": lags, "problems": problems, "short": short, "steps": count}
    Path(out_file).write_text(json.dumps(found))


class Round(NamedTuple):
    rate: float  # runs/s
    lags: list[float]
    cpu: float  # the workers' CPU seconds per run
    watching: float  # the watchers' process's CPU seconds per run
    short: int = 0  # steps whose deltas were not whole at their model_turn
    steps: int = 0  # steps with deltas


def _round(count: int, watchers: int, env: dict[str, str], *, deltas: bool = True) -> Round:
    """One round on a fresh database."""
    name, url = throughput.fresh_database()
    try:
        eng = _engine(url)
        limits = {"max_steps": 50, "max_tool_calls": 50}
        ids = [eng.sync.start_run("bench", f"job {i}", limits=limits).id for i in range(count)]
        with tempfile.TemporaryDirectory() as tmp:
            watcher, out = None, ""
            if watchers:
                flag = "1" if deltas else "0"
                watcher, out = throughput.start_watchers(__file__, url, ids, watchers, tmp, flag)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            _carry(url, tmp, env)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, reaped
            cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / count
            rate, _ = throughput.carried(eng, count)
            lags: list[float] = []
            watching, short, steps = 0.0, 0, 0
            if watcher is not None:
                if watcher.wait(timeout=600) != 0:
                    raise RuntimeError("the watcher process failed")
                end = resource.getrusage(resource.RUSAGE_CHILDREN)
                watching = end.ru_utime + end.ru_stime - after.ru_utime - after.ru_stime
                watched = json.loads(Path(out).read_text())
                if watched["problems"]:
                    raise RuntimeError(f"deltas wrong: {watched['problems'][:5]}")
                lags, short, steps = watched["lags"], watched["short"], watched["steps"]
        eng.close()
        return Round(rate, lags, cpu, watching / count, short, steps)
    finally:
        throughput.drop_database(name)


def _carry(url: str, tmp: str, env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "tether", "worker", "--exit-when-idle", "--no-reap"]
    command += ["--concurrency", "8", "--agent", "bench_agent:text_agent"]
    throughput.run_workers(command, _env(url, **env), tmp, WORKERS)


def _quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    if not ordered:
        return float("nan"), float("nan")
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


def rates(args: argparse.Namespace) -> None:
    base = {"BENCH_PIECES": str(args.pieces), "BENCH_DELAY_S": "0"}
    on = {**base, "BENCH_STREAM": "1"}
    setups = [
        ("off", 0, {**base, "BENCH_STREAM": "0"}, True),
        ("on", 0, on, True),
        ("events", args.watchers, on, False),
        ("watched", args.watchers, on, True),
    ]
    found: dict[str, list[float]] = {label: [] for label, _, _, _ in setups}
    cpus: dict[str, list[float]] = {label: [] for label, _, _, _ in setups}
    watching: dict[str, list[float]] = {label: [] for label, _, _, _ in setups}
    short, steps = 0, 0
    for i in range(args.repeat):
        for label, watchers, env, deltas in setups if i % 2 == 0 else setups[::-1]:
            done = _round(args.runs, watchers, env, deltas=deltas)
            rate, cpu, other = done.rate, done.cpu, done.watching
            short, steps = short + done.short, steps + done.steps
            found[label].append(rate)
            cpus[label].append(cpu * 1000)
            watching[label].append(other * 1000)
            print(
                f"round {i + 1}, {label:>7}: {rate:.1f} runs/s, workers {cpu * 1000:.1f} ms CPU"
                f"/run, watchers {other * 1000:.1f}",
                flush=True,
            )
    m_rate, m_cpu, m_other = (
        {k: statistics.median(v[k]) for k in v} for v in (found, cpus, watching)
    )
    off = m_rate["off"]
    print(
        f"\n1. {args.runs} runs x 10 turns x {args.pieces} pieces, {WORKERS} workers x 8, "
        f"load average {os.getloadavg()[0]:.2f}; medians of {args.repeat} rounds"
    )
    labels = {
        "off": "streaming off",
        "on": "streaming on, no watchers",
        "events": f"streaming on, {args.watchers} watchers of the events only",
        "watched": f"streaming on, {args.watchers} watchers with deltas",
    }
    for key, label in labels.items():
        print(
            f"  {label}: {m_rate[key]:.1f} runs/s ({m_rate[key] / off:.3f}x off); CPU ms/run: "
            f"workers {m_cpu[key]:.1f}, watchers' process {m_other[key]:.1f}"
        )
    print(f"  steps with deltas not whole at their model_turn: {short} of {steps}")


def lag(args: argparse.Namespace) -> None:
    env = {"BENCH_PIECES": str(args.pieces), "BENCH_DELAY_S": str(args.delay)}
    found = _round(args.lag_runs, args.watchers, env)
    median, p99 = _quantiles(found.lags)
    print(
        f"\n2. delta lag, {args.lag_runs} runs, pieces {args.delay * 1000:.0f} ms apart, "
        f"{args.watchers} watchers in another process ({found.rate:.1f} runs/s)"
    )
    pieces = len(found.lags)
    print(f"  median {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms over {pieces} pieces")
    print(f"  steps with deltas not whole at their model_turn: {found.short} of {found.steps}")


# -- 3. memory with stalled watchers -----------------------------------------------------------


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _memory_role(url: str, count: int, stalled: int, out_file: str) -> None:
    from tether.worker import Worker

    os.environ.update(BENCH_PIECES="100", BENCH_PIECE_CHARS="80", BENCH_DELAY_S="0")
    eng = _engine(url)
    samples: list[tuple[int, int]] = []

    async def main() -> None:
        limits = {"max_steps": 50, "max_tool_calls": 50}
        ids = [(await eng.start_run("bench", f"job {i}", limits=limits)).id for i in range(count)]
        watches = [eng.watch(run_id, deltas=True) for run_id in ids[:stalled]]
        for watch in watches:
            await anext(watch)  # its ``created``, then it never reads again
        worker = Worker(eng, concurrency=8)
        carrying = asyncio.create_task(worker.run(reap=False))
        step = max(count // 10, 1)
        while True:
            done = (await eng.operator.counts_by_state())["answered"]
            if done >= step * (len(samples) + 1) or done == count:
                samples.append((done, _rss_kib()))
            if done == count:
                break
            await asyncio.sleep(0.2)
        worker.stop()
        await carrying
        hub = eng.runner.services.deltas
        held = 0 if hub is None else len(hub._runs)
        Path(out_file).write_text(json.dumps({"samples": samples, "held": held}))
        for watch in watches:
            await watch.aclose()  # type: ignore[attr-defined]  # an async generator

    asyncio.run(main())
    eng.close()


def memory(args: argparse.Namespace) -> None:
    name, url = throughput.fresh_database()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "memory.json")
            role = ["--memory-role", url, str(args.memory_runs), str(args.watchers), out]
            subprocess.run([sys.executable, __file__, *role], cwd=throughput.ROOT, check=True)
            found = json.loads(Path(out).read_text())
    finally:
        throughput.drop_database(name)
    print(
        f"\n3. one process carrying {args.memory_runs} runs (10 turns of 8,000 characters), "
        f"{args.watchers} stalled watchers"
    )
    first = found["samples"][0][1]
    for done, rss in found["samples"]:
        print(f"  {done:>5} runs answered: RSS {rss / 1024:.1f} MiB ({(rss - first) / 1024:+.1f})")
    print(f"  runs the hub still holds at the end: {found['held']}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--watch-role":
        url, ids_file, count, out, deltas = sys.argv[2:]
        _watch_role(url, ids_file, int(count), out, deltas == "1")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-role":
        url, count, stalled, out = sys.argv[2:]
        _memory_role(url, int(count), int(stalled), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--lag-runs", type=int, default=200)
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pieces", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--memory-runs", type=int, default=1000)
    parser.add_argument("--only", choices=["notify", "rate", "lag", "memory"])
    args = parser.parse_args()
    parts: dict[str, Any] = {"notify": lambda: notify_cost(), "rate": lambda: rates(args)}
    parts.update(lag=lambda: lag(args), memory=lambda: memory(args))
    for name, part in parts.items():
        if args.only in (None, name):
            part()


if __name__ == "__main__":
    main()
