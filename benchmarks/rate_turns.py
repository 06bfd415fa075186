"""One user's looping run against another user's one-step run under the fleet's model rate
(reference §13): how long the second user's run takes to be answered.

Two ``tether worker`` processes (``--concurrency 1`` each, so each carries one of the two
runs and the share is decided across processes) under ``TETHER_MODEL_RPM`` (10) over a
``TETHER_MODEL_RATE_WINDOW_S`` window (20 s), whose model answers each request after
``BENCH_MODEL_S`` (0.14 s): ``ana`` asks a question that loops (a ``fetch`` call a turn,
hundreds of turns); ``--after`` seconds (a third of the window) after her run's first
request, ``bo`` asks one that is answered in one step. Printed for each round (a fresh
database each), on the database's clock: bo's time from creation to answer, and how many
model turns ana's run had before bo's run came (what the spread of the window costs her).
The medians of ``--repeat`` rounds, per backend.

Run: .venv/bin/python benchmarks/rate_turns.py [--repeat 3] [--backends postgresql,sqlite]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_agent  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from compare_common import fresh_database  # noqa: E402

from tether import Engine, MemoryNotifier  # noqa: E402
from tether.config import Settings  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402
from tether.store.sql.schema import run_events  # noqa: E402


def _new(url: str, user: str, question: str) -> str:
    """A run of the workers' agent (so of the version they serve)."""
    engine = Engine(
        agent=bench_agent.loop_agent(),
        model=bench_agent.LoopOrAnswer(),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )
    try:
        limits = {"max_steps": 200, "max_tool_calls": 200}
        return engine.sync.start_run(user, question, limits=limits).id
    finally:
        engine.close()


def _times(store: Store, run_id: str, kind: str) -> list[float]:
    query = (
        sa.select(run_events.c.at)
        .where(run_events.c.run_id == run_id, run_events.c.kind == kind)
        .order_by(run_events.c.id)
    )
    with store.engine.connect() as conn:
        return [float(at) for at in conn.execute(query).scalars()]


def _poll(what: str, check: object, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _round(backend: str, args: argparse.Namespace) -> tuple[float, int]:
    with fresh_database(backend) as db:
        store = Store(db.url)
        upgrade(store.engine)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update(
            TETHER_DATABASE_URL=db.url,
            TETHER_MODEL_RPM=str(args.rpm),
            TETHER_MODEL_RATE_WINDOW_S=str(args.window),
            TETHER_REAPER_INTERVAL_S="3600",
            PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE)) if p),
        )
        command = [sys.executable, "-m", "tether", "worker", "--no-reap", "--concurrency", "1"]
        command += ["--agent", "bench_agent:loop_agent"]
        ana = _new(db.url, "ana", "loop")
        workers = [
            subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
            for _ in range(2)
        ]
        try:
            _poll("ana's first request", lambda: _times(store, ana, "model_turn"))
            time.sleep(args.after)
            bo = _new(db.url, "bo", "once")
            _poll("bo's answer", lambda: _times(store, bo, "answered"))
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(timeout=60)
        created = _times(store, bo, "created")[0]
        answered = _times(store, bo, "answered")[0]
        turns = _times(store, ana, "model_turn")
        first_window = sum(1 for at in turns if at < created)
        store.close()
    return answered - created, first_window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=int, default=10)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--after", type=float, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="postgresql,sqlite")
    args = parser.parse_args()
    if args.after is None:
        args.after = args.window / 3
    print(
        f"rate_turns: RPM {args.rpm} over {args.window:g} s, model 0.14 s, bo's run "
        f"{args.after:g} s after ana's first request; load average {os.getloadavg()[0]:.1f}"
    )
    for backend in args.backends.split(","):
        rounds = [_round(backend, args) for _ in range(args.repeat)]
        waits = [wait for wait, _ in rounds]
        firsts = [first for _, first in rounds]
        print(
            f"  {backend:<11} bo answered after {statistics.median(waits):.2f} s (median; "
            f"{', '.join(f'{w:.2f}' for w in waits)}); ana's turns before bo came: "
            f"{statistics.median(firsts):g}"
        )


if __name__ == "__main__":
    main()
