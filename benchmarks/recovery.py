"""Orphans in bulk on PostgreSQL: how long two ``tether worker`` processes take to
recover 1,000 runs whose owner died.

Setup, on a fresh database: N runs are created and claimed in this process under an
owner that then "dies" (it never writes again). Half of them get an assistant turn with
an unanswered read call (``fetch``), as a crash after the turn's intent leaves them; the
other half crashed before their first model turn. Their heartbeats are then made stale by
an UPDATE of ``heartbeat_at`` (setup only). Two real ``tether worker --agent
bench_agent:agent`` processes (concurrency 8 each, ``TETHER_REAPER_INTERVAL_S`` =
``--interval``) are started, and the figures are read from the trace, on the database's
clock, from just before the workers were started:

- claimed: the last orphan's ``recovering`` event (a reaper took it: new lease epoch,
  ``recovery_attempts`` + 1);
- recovered: the last orphan's hand-back after reconciliation (``released`` with
  ``why = recovered``; its unanswered call was processed first);
- answered: the last run's answer (every run is a 10-step scripted run).

Target: every orphan recovered within one reaper interval + 5 s, judged on the median of
``--repeat`` rounds (each on a fresh database). Prints PASS / MISS, never asserts.

Run: .venv/bin/python benchmarks/recovery.py [--orphans 1000] [--interval 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from throughput import drop_database, engine, fresh_database  # noqa: E402

from tether import Engine  # noqa: E402
from tether.runs import Run  # noqa: E402
from tether.store import Intent, Store  # noqa: E402
from tether.store.backend.clock import db_now  # noqa: E402
from tether.store.sql.schema import run_events, runs  # noqa: E402

DEAD = "dead-host:1:00000000"  # the owner that crashed
WORKERS = 2
CONCURRENCY = 8
SLACK_S = 5.0  # the target: one reaper interval + this


def _turn(run: Run) -> dict[str, Any]:
    """The bench script's first turn (a ``fetch``), as the model would have answered it."""
    function = {"name": "fetch", "arguments": '{"n": 0}'}
    call = {"id": "call_0_0", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _persist_turn(store: Store, run: Run) -> None:
    """The turn and its ledger intent, durable; the read it asks for never ran."""
    intent = Intent(tool_call_id="call_0_0", tool="fetch", arguments={"n": 0}, effect="read")
    args: dict[str, Any] = {
        "message": _turn(run),
        "spend_usd": 0.0,
        "elapsed_ms": 5,
        "intents": [intent],
        "final": False,
        "event": {"input_tokens": 10, "output_tokens": 5},
    }
    if "seq" in inspect.signature(store.persist_turn).parameters:
        args["seq"] = run.message_count  # the store's idempotent writes name their seq
    store.persist_turn(run.lease(), **args)


async def _create(eng: Engine, count: int) -> list[str]:
    limits = {"max_steps": 50, "max_tool_calls": 50}
    return [(await eng.start_run("bench", f"job {i}", limits=limits)).id for i in range(count)]


def make_orphans(eng: Engine, count: int) -> list[str]:
    """``count`` runs claimed by ``DEAD``, half of them with an unanswered read; then every
    heartbeat made stale."""
    ids = asyncio.run(_create(eng, count))
    store = eng.runner.store
    for i, run_id in enumerate(ids):
        run = store.claim_ready(DEAD, run_id)
        assert run is not None, run_id
        if i % 2 == 0:
            _persist_turn(store, run)
    with store.engine.begin() as conn:
        stale = runs.c.heartbeat_at - 3600
        conn.execute(runs.update().where(runs.c.owner == DEAD).values(heartbeat_at=stale))
    return ids


def _env(url: str, interval: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(
        TETHER_DATABASE_URL=url,
        PYTHONPATH=os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
        BENCH_SCRIPT="ten",
        TETHER_REAPER_INTERVAL_S=str(interval),
    )
    return env


def _now(store: Store) -> float:
    with store.engine.connect() as conn:
        return float(conn.execute(sa.select(db_now())).scalar_one())


def _progress(store: Store) -> dict[str, Any]:
    """Counts and the latest time of each milestone, from the trace and the runs."""
    recovering = run_events.c.kind == "recovering"
    recovered = sa.and_(
        run_events.c.kind == "released", run_events.c.data["why"].as_string() == "recovered"
    )
    answered = run_events.c.kind == "answered"
    with store.engine.connect() as conn:

        def milestone(where: Any) -> tuple[int, float | None]:
            runs_seen = sa.func.count(sa.distinct(run_events.c.run_id))
            query = sa.select(runs_seen, sa.func.max(run_events.c.at)).where(where)
            n, last = conn.execute(query).one()
            return int(n), (float(last) if last is not None else None)

        first = conn.execute(sa.select(sa.func.min(run_events.c.at)).where(recovering)).scalar()

        dead = conn.execute(sa.select(sa.func.count()).where(runs.c.owner == DEAD)).scalar_one()
        attempts = conn.execute(sa.select(sa.func.max(runs.c.recovery_attempts))).scalar_one()
        return {
            "first": float(first) if first is not None else None,
            "claimed": milestone(recovering),
            "recovered": milestone(recovered),
            "answered": milestone(answered),
            "dead_owned": int(dead),
            "max_attempts": int(attempts or 0),
        }


def _start_workers(url: str, interval: float, logs: Path) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "tether", "worker", "--concurrency", str(CONCURRENCY)]
    return [
        subprocess.Popen(
            [*command, "--agent", "bench_agent:agent"],
            env=_env(url, interval),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(logs / f"w{w}.log", "w"),  # closed with the process
        )
        for w in range(WORKERS)
    ]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(count: int, interval: float, deadline_s: float) -> dict[str, Any]:
    """Create the orphans, start the workers, and wait for every run to answer."""
    name, url = fresh_database()
    try:
        eng = engine(url, "ten")
        make_orphans(eng, count)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = _now(eng.runner.store)
            procs = _start_workers(url, interval, Path(tmp))
            try:
                deadline = time.monotonic() + deadline_s
                while True:
                    seen = _progress(eng.runner.store)
                    if seen["answered"][0] >= count or time.monotonic() > deadline:
                        break
                    if any(p.poll() is not None for p in procs):
                        raise RuntimeError((Path(tmp) / "w0.log").read_text()[-3000:])
                    time.sleep(0.5)
            finally:
                _stop(procs)
        eng.close()
        return {"t0": t0, **seen}
    finally:
        drop_database(name)


def _figure(label: str, seen: tuple[int, float | None], t0: float, count: int) -> float | None:
    n, last = seen
    if n < count or last is None:
        print(f"  {label:<10} {n:>5} / {count}  (not all within the deadline)")
        return None
    print(f"  {label:<10} {n:>5} / {count}  {last - t0:>7.2f} s after the workers' start")
    return last - t0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one_round(args: argparse.Namespace, number: int) -> float | None:
    """One fresh database and one pair of workers; the recovery time (None: not all)."""
    print(f"round {number} (load average {_load()})")
    seen = measure(args.orphans, args.interval, args.deadline)
    t0 = seen["t0"]
    if seen["first"] is not None:
        print(f"  first orphan claimed {seen['first'] - t0:.2f} s after the workers' start")
    _figure("claimed", seen["claimed"], t0, args.orphans)
    recovered = _figure("recovered", seen["recovered"], t0, args.orphans)
    _figure("answered", seen["answered"], t0, args.orphans)
    print(
        f"  still owned by the dead owner: {seen['dead_owned']}; "
        f"max recovery_attempts: {seen['max_attempts']}; load average after {_load()}"
    )
    return recovered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orphans", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0, help="TETHER_REAPER_INTERVAL_S")
    parser.add_argument("--deadline", type=float, default=600.0, help="give up after (s)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the median is judged)")
    args = parser.parse_args()
    print(
        f"PostgreSQL, {args.orphans} orphans (half with an unanswered read), {WORKERS} workers "
        f"x {CONCURRENCY}, reaper interval {args.interval:g} s"
    )
    times = [one_round(args, n + 1) for n in range(args.repeat)]
    target = args.interval + SLACK_S
    if any(t is None for t in times):
        print(f"  not every orphan was recovered in every round -> MISS (target {target:g} s)")
        return
    median = statistics.median(t for t in times if t is not None)
    verdict = "PASS" if median <= target else "MISS"
    shown = ", ".join(f"{t:.2f}" for t in times if t is not None)
    print(
        f"recovered, median of {args.repeat}: {median:.2f} s ({shown}); target interval + "
        f"{SLACK_S:g} s = {target:g} s -> {verdict}"
    )


if __name__ == "__main__":
    main()
