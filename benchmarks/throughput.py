"""Service throughput on PostgreSQL.

1. Runs per second for 10-step scripted runs (9 tool steps + the answer) carried by 1, 2
   and 4 worker processes (``tether worker``, concurrency 8 each) sharing one database.
   The window is measured on the database's clock, from the first step to the last
   answer, so process start-up is not counted.
2. The latency (median, p99) of 50 concurrent approvals of one token: 50 threads, each
   with its own engine, released together; exactly one wins, 49 get already_resumed.
3. The latency of the claim of an approval (target: p99 <= 10 ms), in process: 50
   approvals of one token started together on one engine (as one ``tether serve``
   carries them), each timed from its entry into ``Engine.resume_after_confirmation``
   until its claim is decided: the winner's ``claim_decision`` returned the run, a loser
   got ``AlreadyResumed``. The tool the winner then runs is not counted. Measured with
   the store's default pool and thread pool (10 + 20 connections, as many threads), then
   with both at 8 and at 60, to tell whether they bound it; and once more with the
   default pool after ``gc.freeze()`` (as a server could do once started), since the
   tail that remains is the interpreter's full garbage collections (50-60 ms each here).

Run: .venv/bin/python benchmarks/throughput.py [--runs 200] [--rounds 5] [--tokens 50]
     (``--only claims`` for part 3 alone)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_agent  # noqa: E402

from tether import Engine, MemoryNotifier  # noqa: E402
from tether.config import Settings  # noqa: E402
from tether.errors import AlreadyResumed  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402
from tether.store.backend import faults  # noqa: E402
from tether.store.backend.connect import normalize_url  # noqa: E402
from tether.store.claims import SuspensionClaim  # noqa: E402
from tether.store.sql.schema import run_events, runs  # noqa: E402

ADMIN = os.environ.get("TETHER_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def fresh_database() -> tuple[str, str]:
    name = f"tether_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = ADMIN.rpartition("/")[0] + "/" + name
    store = Store(url)
    upgrade(store.engine)
    store.close()
    return name, url


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def engine(url: str, script: str) -> Engine:
    os.environ["BENCH_SCRIPT"] = script
    return Engine(
        agent=bench_agent.agent(),
        model=bench_agent.model(),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )


def worker_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(
        TETHER_DATABASE_URL=url,
        PYTHONPATH=str(HERE),
        BENCH_SCRIPT="ten",
        TETHER_REAPER_INTERVAL_S="3600",
    )
    return env


def runs_per_second(workers: int, count: int) -> tuple[float, float]:
    """(runs/s, seconds) for ``count`` 10-step runs carried by ``workers`` processes."""
    name, url = fresh_database()
    try:
        eng = engine(url, "ten")
        limits = {"max_steps": 50, "max_tool_calls": 50}
        for i in range(count):
            eng.sync.start_run("bench", f"job {i}", limits=limits)
        with tempfile.TemporaryDirectory() as logs:
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tether",
                        "worker",
                        "--exit-when-idle",
                        "--no-reap",
                        "--concurrency",
                        "8",
                        "--agent",
                        "bench_agent:agent",
                    ],
                    env=worker_env(url),
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=open(Path(logs) / f"w{w}.log", "w"),
                )
                for w in range(workers)
            ]
            for proc in procs:
                if proc.wait(timeout=600) != 0:
                    raise RuntimeError((Path(logs) / "w0.log").read_text()[-2000:])
        rate = carried(eng, count)
        eng.close()
        return rate
    finally:
        drop_database(name)


def carried(eng: Engine, count: int) -> tuple[float, float]:
    """(runs/s, seconds) of the ``count`` runs just carried on ``eng``'s database, on the
    database's clock from the first step to the last answer; every run must have answered."""
    with eng.runner.store.engine.connect() as conn:
        counted = conn.execute(sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state))
        states: dict[str, int] = {str(state): int(n) for state, n in counted}
        first, last = conn.execute(
            sa.select(sa.func.min(run_events.c.at), sa.func.max(run_events.c.at)).where(
                run_events.c.kind.in_(["model_turn", "answered"])
            )
        ).one()
    if states != {"answered": count}:
        raise RuntimeError(f"not every run answered: {states}")
    seconds = float(last) - float(first)
    return count / seconds, seconds


def run_workers(
    command: list[str], env: dict[str, str], tmp: str, workers: int = 2, timeout: float = 900
) -> None:
    """``workers`` processes of ``command`` (a ``tether worker --exit-when-idle``) to their
    end, their stderr in ``tmp``; the first one's log if one failed."""
    for proc in start_workers(command, env, tmp, workers):
        if proc.wait(timeout=timeout) != 0:
            raise RuntimeError((Path(tmp) / "w0.log").read_text()[-2000:])


def start_workers(
    command: list[str], env: dict[str, str], tmp: str, workers: int
) -> list[subprocess.Popen[bytes]]:
    """``workers`` processes of ``command`` started, each with its stderr in ``tmp``."""
    return [
        subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(Path(tmp) / f"w{w}.log", "w"),
        )
        for w in range(workers)
    ]


def start_watchers(
    script: str, url: str, ids: list[str], watchers: int, tmp: str, *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    """``script``'s ``--watch-role`` process following ``ids`` with ``watchers`` watchers
    (and ``extra`` arguments), once it is ready; and the file it writes what it saw to."""
    ids_file, out = str(Path(tmp) / "ids.json"), str(Path(tmp) / "watched.json")
    Path(ids_file).write_text(json.dumps(ids))
    role = ["--watch-role", url, ids_file, str(watchers), out, *extra]
    return start_role(script, role, out + ".ready"), out


def start_role(script: str, role: list[str], ready: str) -> subprocess.Popen[bytes]:
    """``script`` in a process of its own with ``role``'s arguments, once it has created
    the file ``ready`` (within 60 s)."""
    proc = subprocess.Popen([sys.executable, script, *role], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not Path(ready).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the process of {role[0]} did not start")
        time.sleep(0.05)
    return proc


def approval_latencies(rounds: int, concurrent: int = 50) -> tuple[list[float], int]:
    """Per-call latencies (ms) of ``concurrent`` simultaneous approvals of one token, over
    ``rounds`` tokens; and how many calls won (must equal ``rounds``)."""
    name, url = fresh_database()
    latencies: list[float] = []
    wins = 0
    try:
        engines = [engine(url, "publish") for _ in range(concurrent)]
        for _ in range(rounds):
            notifier = MemoryNotifier()
            starter = Engine(
                agent=bench_agent.agent(),
                model=bench_agent.model(),
                settings=Settings(database_url=url),
                notifier=notifier,
            )
            outcome = starter.sync.ask("bench", "publish a")
            token = notifier.last(outcome.run_id).token
            starter.close()
            barrier = threading.Barrier(concurrent)
            results: list[tuple[float, bool]] = []
            lock = threading.Lock()

            def approve(
                e: Engine,
                tok: str = token,
                bar: threading.Barrier = barrier,
                out: list[tuple[float, bool]] = results,
                guard: threading.Lock = lock,
            ) -> None:
                bar.wait()
                start = time.perf_counter()
                try:
                    e.sync.resume_after_confirmation(tok, "approve", "bench")
                    won = True
                except AlreadyResumed:
                    won = False
                with guard:
                    out.append(((time.perf_counter() - start) * 1000, won))

            threads = [threading.Thread(target=approve, args=(e,)) for e in engines]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            latencies.extend(ms for ms, _ in results)
            wins += sum(1 for _, won in results if won)
        for e in engines:
            e.close()
        return latencies, wins
    finally:
        drop_database(name)


def _sized(eng: Engine, url: str, size: int | None) -> None:
    """Give ``eng``'s store a pool of ``size`` connections (and so as many threads),
    before its first use; None keeps the default."""
    if size is None:
        return
    eng.runner.store.engine.dispose()
    eng.runner.store.engine = sa.create_engine(
        normalize_url(url), pool_size=size, max_overflow=0, pool_timeout=30
    )
    faults.track_commits(eng.runner.store.engine)


def _timed_claims(store: Store, decided: dict[str, float]) -> None:
    """Record when the winning claim of each token hash was decided (in its thread, as
    the claim returns). Bound to the store, so ``hop`` still finds its executor."""
    claim = store.claim_decision

    def timed(self: Store, **kwargs: Any) -> SuspensionClaim:
        result = claim(**kwargs)
        if result.run is not None:
            decided[kwargs["token_hash"]] = time.perf_counter()
        return result

    setattr(store, "claim_decision", types.MethodType(timed, store))  # noqa: B010


async def _claim_round(eng: Engine, notifier: MemoryNotifier, concurrent: int) -> list[float]:
    """One token, ``concurrent`` approvals started together; each one's claim latency."""
    from tether.tokens import hash_token

    outcome = await eng.ask("bench", "publish a")
    token = notifier.last(outcome.run_id).token
    decided: dict[str, float] = {}
    _timed_claims(eng.runner.store, decided)

    async def approve() -> tuple[float, bool]:
        start = time.perf_counter()
        try:
            await eng.resume_after_confirmation(token, "approve", "bench")
        except AlreadyResumed:
            return (time.perf_counter() - start) * 1000, False
        return (decided[hash_token(token)] - start) * 1000, True

    results = await asyncio.gather(*(approve() for _ in range(concurrent)))
    if sum(won for _, won in results) != 1:
        raise RuntimeError(f"{sum(won for _, won in results)} approvals won one token")
    return [ms for ms, _ in results]


async def _claims(
    url: str, tokens: int, concurrent: int, size: int | None, freeze: bool
) -> list[float]:
    notifier = MemoryNotifier()
    os.environ["BENCH_SCRIPT"] = "publish"
    eng = Engine(
        agent=bench_agent.agent(),
        model=bench_agent.model(),
        settings=Settings(database_url=url),
        notifier=notifier,
    )
    _sized(eng, url, size)
    latencies: list[float] = []
    try:
        await _claim_round(eng, notifier, concurrent)  # warm the pool and the caches
        if freeze:  # what a server could do once started: full collections skip all that
            gc.collect()
            gc.freeze()
        for _ in range(tokens):
            latencies.extend(await _claim_round(eng, notifier, concurrent))
    finally:
        gc.unfreeze()
        await eng.aclose()
    return latencies


def claim_latencies(
    tokens: int, concurrent: int = 50, size: int | None = None, *, freeze: bool = False
) -> list[float]:
    """Claim latencies (ms) of ``concurrent`` approvals of each of ``tokens`` tokens."""
    name, url = fresh_database()
    try:
        return asyncio.run(_claims(url, tokens, concurrent, size, freeze))
    finally:
        drop_database(name)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def print_claims(tokens: int) -> None:
    print(
        f"\nThe claim of an approval, 50 concurrent approvals of one token on one engine, "
        f"{tokens} tokens (target p99 <= 10 ms)"
    )
    print(f"{'pool / threads':>28} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  verdict")
    configs = [("10 + 20 (default)", None, False), ("8", 8, False), ("60", 60, False)]
    configs.append(("10 + 20, gc.freeze() at start", None, True))
    for label, size, freeze in configs:
        ms = claim_latencies(tokens, size=size, freeze=freeze)
        verdict = "PASS" if _p(ms, 0.99) <= 10.0 else "MISS"
        print(f"{label:>28} {_p(ms, 0.5):>8.1f} {_p(ms, 0.99):>8.1f} {max(ms):>8.1f}  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--only", choices=["claims"], default=None)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.only == "claims":
        print_claims(args.tokens)
        return
    print(f"PostgreSQL, {args.runs} runs of 10 steps each (9 tool steps + answer)")
    print(f"{'workers':>8} {'runs/s':>10} {'seconds':>9} {'vs 1 worker':>12}")
    base: float | None = None
    for workers in (1, 2, 4):
        rate, seconds = runs_per_second(workers, args.runs)
        base = base or rate
        print(f"{workers:>8} {rate:>10.1f} {seconds:>9.2f} {rate / base:>11.2f}x")
    latencies, wins = approval_latencies(args.rounds)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(f"\n50 concurrent approvals of one token, {args.rounds} rounds ({len(latencies)} calls)")
    print(f"  winners per token: {wins / args.rounds:.0f} (must be 1)")
    print(
        f"  latency median {statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms, "
        f"max {latencies[-1]:.1f} ms"
    )
    print_claims(args.tokens)


if __name__ == "__main__":
    main()
