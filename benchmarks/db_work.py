"""The database's work per step, by kind of step, against the floor's one transaction.

Each kind runs on a fresh PostgreSQL database (``synchronous_commit=on``, as shipped), in
this process, through the public ``Engine`` with a scripted model, ``--steps`` times:

- **read step**: a model turn that calls a read tool, stored with its result in one
  commit (``persist_turn``);
- **write step**: a model turn that calls a write tool (no confirmation): the turn with
  its intent, then the result (two commits);
- **suspension**: a run whose first turn calls a tool that needs confirmation (the
  suspension's write), then the approval that claims it (``claim_decision``), the tool,
  its result and the answer: per suspension, everything from the run's creation to its
  answer;
- **claim**: a worker's claim of a waiting run (``claim_waiting``, one run per claim),
  each claimed run cancelled untimed;
- **floor**: one transaction per step through psycopg, INSERT the step's two messages
  (OpenAI-format JSON) and UPDATE a counters row.

For each: transactions, statements and round trips (psycopg sends BEGIN and COMMIT as
round trips of their own; a read outside a transaction is its statement alone) counted
in the client, rows inserted, updated and deleted (``pg_stat_user_tables``, once the
engine's connections have closed), WAL bytes (``pg_current_wal_lsn()`` difference,
cluster-wide: run it on a quiet machine) and PostgreSQL's CPU (every ``postgres``
process, from ``/proc``), each per step (a run's start and end amortised over its
steps), and the ratio to the floor.

Then what it costs to learn a transaction's id (so that a COMMIT whose answer was lost
can be settled with ``txid_status()``): a step write's transaction timed plain, with the
id in its statement's RETURNING, and with a ``SELECT txid_current()`` of its own.

Run: .venv/bin/python benchmarks/db_work.py [--steps 200] [--txid 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402
from capacity import postgres_cpu_s  # noqa: E402
from compare_common import tool_result, tool_text  # noqa: E402

from tether import (  # noqa: E402
    Agent,
    Engine,
    MemoryNotifier,
    ScriptedModel,
    Settings,
    StopKind,
    ToolContext,
    tool,
)
from tether.budget import Limits  # noqa: E402

CAP = Limits(max_steps=100_000, max_spend_usd=1e6, max_tool_calls=1_000_000, max_elapsed_ms=10**9)


@tool
def fetch(n: int) -> dict[str, Any]:
    """Fetch record n (a read)."""
    return tool_result(n)


@tool(effect="write", dedupes=True)
def record(ctx: ToolContext, n: int) -> dict[str, Any]:
    """Record n (a write whose downstream dedupes by key)."""
    return tool_result(n)


def _preview(args: Any, scope: Any) -> dict[str, Any]:
    return {"n": args.n}


@tool(effect="write", dedupes=True, needs_confirmation=True, preview=_preview)
def send(ctx: ToolContext, n: int) -> dict[str, Any]:
    """Send n (a write a person confirms)."""
    return {"n": n, "key": ctx.idempotency_key}


AGENT = Agent(name="dbwork", system_prompt="bench", tools=(fetch, record, send))


def calls(name: str, steps: int) -> list[dict[str, Any]]:
    """``steps`` turns, each calling ``name``, then the answer."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": name, "arguments": {"n": i}}]} for i in range(steps)
    ]
    return [*turns, {"content": "done"}]


# -- counting --------------------------------------------------------------------------------


class Counts:
    """Statements and transactions the store's engine sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements = 0
        self.transactions = 0

    def attach(self, engine: sa.Engine) -> None:
        @sa.event.listens_for(engine, "before_cursor_execute")
        def _statement(*_: Any) -> None:
            with self.lock:
                self.statements += 1

        @sa.event.listens_for(engine, "commit")
        def _commit(*_: Any) -> None:
            with self.lock:
                self.transactions += 1


@dataclass
class Work:
    kind: str
    per: int  # steps (or suspensions, or claims) measured
    transactions: float
    statements: float
    round_trips: float
    rows: float
    wal: float
    cpu_ms: float


def _wal(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])


def _rows(url: str) -> int:
    """Rows inserted, updated and deleted in the database's tables so far, once the
    statistics of the backends that did it have arrived."""
    query = "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
    last, deadline = -1, time.monotonic() + 10
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(query).fetchone()
            seen = int(row[0]) if row else 0
            if seen == last or time.monotonic() > deadline:
                return seen
            last = seen
            time.sleep(0.6)  # backends send their counts at most once a second


@contextmanager
def measured(
    kind: str, per: int, url: str, engine: Engine, counts: Counts, out: list[Work]
) -> Iterator[None]:
    """Measure what the block does to the database; ``per`` is what it is divided by.
    The engine's connections are closed first, so the rows counted before are all the
    rows written before (a backend sends its counts when it exits, or idle, at most once
    a second)."""
    engine.runner.store.engine.dispose()
    rows0, wal0, cpu0 = _rows(url), _wal(url), postgres_cpu_s()
    s0, t0 = counts.statements, counts.transactions
    yield
    cpu1, wal1 = postgres_cpu_s(), _wal(url)
    statements, transactions = counts.statements - s0, counts.transactions - t0
    out.append(
        Work(
            kind=kind,
            per=per,
            transactions=transactions / per,
            statements=statements / per,
            round_trips=(statements + 2 * transactions) / per,
            rows=float(rows0),  # the count before: ``rows_since`` makes it per step
            wal=(wal1 - wal0) / per,
            cpu_ms=(cpu1 - cpu0) * 1000 / per,
        )
    )


def rows_since(work: Work, url: str, engine: sa.Engine) -> None:
    """``work``'s rows per step, once ``engine``'s connections are closed (a backend
    sends its counts when it goes idle, at most once a second, or when it exits)."""
    engine.dispose()
    work.rows = (_rows(url) - work.rows) / work.per


# -- the kinds ---------------------------------------------------------------------------------


def engine_for(
    url: str, script: list[dict[str, Any]], counts: Counts, notifier: MemoryNotifier | None = None
) -> Engine:
    engine = Engine(
        agent=AGENT,
        model=ScriptedModel(script),
        settings=Settings(database_url=url, max_limits=CAP),
        notifier=notifier or MemoryNotifier(),
    )
    counts.attach(engine.runner.store.engine)
    return engine


def limits(steps: int) -> dict[str, Any]:
    return {"max_steps": steps + 5, "max_tool_calls": steps + 5, "max_spend_usd": 1e5}


@asynccontextmanager
async def bench_engine(script: list[dict[str, Any]]) -> AsyncIterator[tuple[str, Engine, Counts]]:
    """An open engine playing ``script`` on a fresh database, its statements counted; the
    database is dropped after."""
    name, url = throughput.fresh_database()
    try:
        counts = Counts()
        engine = engine_for(url, script, counts)
        await engine.open()
        yield url, engine, counts
        await engine.aclose()
    finally:
        throughput.drop_database(name)


async def run_steps(kind: str, tool_name: str, steps: int, out: list[Work]) -> None:
    async with bench_engine(calls(tool_name, steps)) as (url, engine, counts):
        with measured(kind, steps, url, engine, counts, out):
            run = await engine.start_run("bench", "go", limits=limits(steps))
            outcome = await engine.run_until_stop(run.id)
            if outcome.kind is not StopKind.ANSWERED:
                raise RuntimeError(f"the {kind} run stopped {outcome.kind.value}")
        rows_since(out[-1], url, engine.runner.store.engine)


async def run_suspensions(count: int, out: list[Work]) -> None:
    script: list[dict[str, Any]] = []
    for i in range(count):
        script += [{"tool_calls": [{"name": "send", "arguments": {"n": i}}]}, {"content": "ok"}]
    async with bench_engine(script) as (url, engine, counts):
        with measured("suspension", count, url, engine, counts, out):
            for _ in range(count):
                asked = await engine.ask("bench", "send it", limits=limits(2))
                if asked.notice is None:
                    raise RuntimeError("the run did not suspend")
                await engine.resume_after_confirmation(asked.notice.token, "approve", "bench")
                done = await engine.run_until_stop(asked.run_id)
                if done.kind is not StopKind.ANSWERED:
                    raise RuntimeError(f"the approved run stopped {done.kind.value}")
        rows_since(out[-1], url, engine.runner.store.engine)


async def run_claims(count: int, out: list[Work]) -> None:
    async with bench_engine([{"content": "done"}]) as (url, engine, counts):
        ids = [(await engine.start_run("bench", f"q{i}")).id for i in range(count)]
        store = engine.runner.store
        claimed: list[str] = []
        with measured("claim", count, url, engine, counts, out):
            for _ in range(count):
                runs = store.claim_waiting("w", 1, versions=[AGENT.agent_version])
                claimed += [r.id for r in runs]
        if sorted(claimed) != sorted(ids):
            raise RuntimeError("not every run was claimed once")
        rows_since(out[-1], url, store.engine)


FLOOR_SCHEMA = (
    "CREATE TABLE floor_runs (run_id TEXT PRIMARY KEY, steps INTEGER NOT NULL)",
    "CREATE TABLE floor_messages (run_id TEXT NOT NULL, seq INTEGER NOT NULL,"
    " message JSON NOT NULL, PRIMARY KEY (run_id, seq))",
)


def run_floor(steps: int, out: list[Work]) -> None:
    name, url = throughput.fresh_database()
    try:
        with psycopg.connect(url) as conn:
            for sql in FLOOR_SCHEMA:
                conn.execute(sql)
            conn.execute("INSERT INTO floor_runs VALUES ('r', 0)")
            conn.commit()
            rows0, wal0, cpu0 = _rows(url), _wal(url), postgres_cpu_s()
            for i in range(steps):
                turn = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{i}",
                            "type": "function",
                            "function": {"name": "fetch", "arguments": json.dumps({"n": i})},
                        }
                    ],
                }
                result = {"role": "tool", "tool_call_id": f"c{i}", "content": tool_text(i)}
                with conn.transaction():
                    insert = "INSERT INTO floor_messages VALUES ('r', %s, %s)"
                    conn.execute(insert, (2 * i, json.dumps(turn)))
                    conn.execute(insert, (2 * i + 1, json.dumps(result)))
                    conn.execute("UPDATE floor_runs SET steps = steps + 1 WHERE run_id = 'r'")
            cpu1, wal1 = postgres_cpu_s(), _wal(url)
        out.append(
            Work(
                kind="floor",
                per=steps,
                transactions=1.0,
                statements=3.0,
                round_trips=5.0,  # BEGIN, three statements, COMMIT
                rows=(_rows(url) - rows0) / steps,
                wal=(wal1 - wal0) / steps,
                cpu_ms=(cpu1 - cpu0) * 1000 / steps,
            )
        )
    finally:
        throughput.drop_database(name)


def report(works: list[Work]) -> None:
    floor = next(w for w in works if w.kind == "floor")
    print(
        f"\nthe database's work per step (PostgreSQL as shipped, synchronous_commit=on; "
        f"load average {os.getloadavg()[0]:.2f})"
    )
    print(
        f"{'kind':<12}{'n':>6}{'txns':>7}{'stmts':>7}{'round trips':>13}{'rows':>7}"
        f"{'WAL B':>9}{'x floor':>9}{'PG CPU ms':>11}{'x floor':>9}"
    )
    for w in works:
        print(
            f"{w.kind:<12}{w.per:>6}{w.transactions:>7.2f}{w.statements:>7.2f}"
            f"{w.round_trips:>13.2f}{w.rows:>7.2f}{w.wal:>9.0f}{w.wal / floor.wal:>8.2f}x"
            f"{w.cpu_ms:>11.3f}{w.cpu_ms / floor.cpu_ms:>8.2f}x"
        )


# -- what a transaction id costs ----------------------------------------------------------------


def txid_cost(count: int) -> None:
    """A step-like write transaction (UPDATE … RETURNING, INSERT) timed three ways, in
    alternating blocks: plain; with ``txid_current()`` in its RETURNING; with a ``SELECT
    txid_current()`` round trip of its own before COMMIT."""
    name, url = throughput.fresh_database()
    try:
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
            conn.execute("CREATE TABLE m (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
            conn.execute("INSERT INTO c VALUES (1, 0)")
            conn.commit()
            body = tool_text(0)

            def plain() -> None:
                with conn.transaction():
                    conn.execute("UPDATE c SET n = n + 1 WHERE id = 1 RETURNING n")
                    conn.execute("INSERT INTO m (body) VALUES (%s)", (body,))

            def returning() -> None:
                with conn.transaction():
                    conn.execute("UPDATE c SET n = n + 1 WHERE id = 1 RETURNING n, txid_current()")
                    conn.execute("INSERT INTO m (body) VALUES (%s)", (body,))

            def asked() -> None:
                with conn.transaction():
                    conn.execute("UPDATE c SET n = n + 1 WHERE id = 1 RETURNING n")
                    conn.execute("INSERT INTO m (body) VALUES (%s)", (body,))
                    conn.execute("SELECT txid_current()")

            ways: dict[str, Callable[[], None]] = {
                "plain": plain,
                "txid in RETURNING": returning,
                "SELECT txid_current()": asked,
            }
            times: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(count // 20):
                for label, way in ways.items():
                    for _ in range(20):
                        began = time.perf_counter()
                        way()
                        times[label].append(time.perf_counter() - began)
            status = conn.execute("SELECT txid_status(txid_current() - 1)").fetchone()
        base = statistics.median(times["plain"])
        print(f"\nwhat learning a transaction's id costs ({count} transactions each, alternating)")
        for label, xs in times.items():
            med = statistics.median(xs)
            print(f"  {label:<24} median {med * 1000:.3f} ms  ({med / base:.2f}x plain)")
        print(f"  txid_status() of an earlier transaction: {status[0] if status else None}")
    finally:
        throughput.drop_database(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--suspensions", type=int, default=100)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--txid", type=int, default=2000)
    args = parser.parse_args()
    works: list[Work] = []
    run_floor(args.steps, works)
    asyncio.run(run_steps("read step", "fetch", args.steps, works))
    asyncio.run(run_steps("write step", "record", args.steps, works))
    asyncio.run(run_suspensions(args.suspensions, works))
    asyncio.run(run_claims(args.claims, works))
    report(works)
    txid_cost(args.txid)


if __name__ == "__main__":
    main()
