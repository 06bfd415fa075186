"""Step overhead: what one durable tool step costs in tether, against a floor.

A scripted run of ``--steps`` (default 200) steps, each one model turn that calls the read
tool ``fetch`` plus the tool's ~8 KB result, is carried by the real engine loop on SQLite
(a temp file: WAL, ``synchronous=FULL``) and on PostgreSQL (a temporary database,
``synchronous_commit=on``). The engine code is not changed: a step is timed from the start
of its model request to the start of the next one (the scripted model stamps them), so it
covers the step's durable commit (a read-only step stores its turn, its ledger entry and
its result together) and all the loop's work; ``Store.persist_turn`` is wrapped on the
instance to tell the time inside the store transaction from the rest.

The floor runs in the same process, on the same database, through the same engine factory
(``tether.store.backend.connect.create_db_engine``, hence the same durability settings): one
transaction per step that INSERTs the step's two messages (a small turn row and the same
8 KB payload) and UPDATEs a counters row. For information, a one-INSERT commit of the
payload alone is timed too. Half of each floor's steps run before the tether run and half
after it, so load that varies over time weighs on both.

Printed per backend, as medians across ``--repeat`` repeats, each on a fresh database:

* the median step time over steps 1-10 and over the last 10 steps, and late / early
  (target <= 1.2: a step must not get dearer as the history grows);
* the floor's median time per step, and tether's median step / floor (target <= 3);
* stored bytes per step: what the whole run (``start_run`` included) added to tether's
  tables, indexes included (SQLite: ``dbstat`` page bytes; PostgreSQL:
  ``pg_total_relation_size``, TOAST included), against what the floor's rows added to the
  floor table (target <= 1.2); for information, the live row bytes (SQLite: ``dbstat``
  payload of the tables' own b-trees; PostgreSQL: ``pg_column_size`` of the rows), the
  growth by table, and the bytes written: on SQLite what this process handed to
  ``write()`` (WAL frames, and the checkpoint that copies them into the database file,
  forced at the end of each measured block; ``/proc/self/io``), on PostgreSQL the WAL
  generated (``pg_current_wal_lsn()`` difference, cluster-wide: other load counts).

Figures are printed, never asserted. Timings are sensitive to other load on the machine:
the load average is printed with each table. Run it from the repository root::

    .venv/bin/python benchmarks/step_overhead.py [--backend sqlite|postgresql|both]
        [--steps 200] [--repeat 3] [--sealed]

``--sealed`` compares, per backend, trials whose content is sealed at rest
(``TETHER_ENCRYPTION_KEYS``, reference §20) with trials in the clear: ms per step and
stored bytes per step, and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import string
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine as DbEngine

from tether import Agent, Engine, MemoryNotifier, ScriptedModel, Settings, StopKind, tool
from tether.budget import Limits
from tether.messages import canonical_json
from tether.models.base import Message, ModelResponse, ToolSpec
from tether.sealing import Keyring, new_key, parse_keys
from tether.store.backend.connect import create_db_engine
from tether.store.sql.schema import metadata as tether_metadata

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PAYLOAD_BYTES = 8192
WINDOW = 10  # steps in the early and in the late window
TARGET_LATE_EARLY = 1.2
TARGET_FLOOR = 3.0
TARGET_BYTES = 1.2
BUSY_LOAD = 0.5  # a 1-minute load average above this means other work competes with ours

TETHER_TABLES = tuple(t.name for t in tether_metadata.sorted_tables)

floor_metadata = sa.MetaData()


def _floor_table(name: str) -> sa.Table:
    return sa.Table(
        name,
        floor_metadata,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("payload", sa.Text, nullable=False),
    )


FLOOR = _floor_table("bench_floor")
FLOOR2 = _floor_table("bench_floor2")
COUNTERS = sa.Table(
    "bench_counters",
    floor_metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("steps", sa.Integer, nullable=False),
)
INSERT_FLOOR = FLOOR.insert()
INSERT_FLOOR2 = FLOOR2.insert()
COUNT_STEP = COUNTERS.update().where(COUNTERS.c.id == 1).values(steps=COUNTERS.c.steps + 1)
# The floor's first message of a step: about the size of a stored assistant turn.
TURN_ROW = "t" * 300


# -- the payload and the agent -----------------------------------------------------------


def _rows(size: int) -> list[dict[str, Any]]:
    """Deterministic records whose canonical JSON is about ``size`` bytes, with random
    (poorly compressible) values, as a real lookup would return."""
    rng = random.Random(size)
    rows: list[dict[str, Any]] = []
    while len(canonical_json(rows)) < size - 120:
        rows.append(
            {
                "id": len(rows),
                "sku": "".join(rng.choices("0123456789abcdef", k=12)),
                "title": "".join(rng.choices(string.ascii_letters + " ", k=40)),
                "price": round(rng.uniform(1, 999), 2),
            }
        )
    return rows


ROWS = _rows(PAYLOAD_BYTES)


def payload(n: int) -> dict[str, Any]:
    """What ``fetch`` returns for step ``n`` (~8 KB once serialized)."""
    return {"n": n, "rows": ROWS}


def payload_text(n: int) -> str:
    """The payload as the floor stores it: serialized once, as the tool's result is."""
    return canonical_json(payload(n))


@tool
def fetch(n: int) -> dict[str, Any]:
    """Fetch a page of records (a read)."""
    return payload(n)


class StampedModel(ScriptedModel):
    """The scripted model, stamping the time each request starts."""

    def __init__(self, turns: Sequence[dict[str, Any]]) -> None:
        super().__init__(turns)
        self.starts: list[float] = []

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.starts.append(time.perf_counter())
        return await super().request(messages, tools)


def script(steps: int) -> list[dict[str, Any]]:
    """``steps`` turns that each call ``fetch``, then a final answer."""
    turns = [{"tool_calls": [{"name": "fetch", "arguments": {"n": i}}]} for i in range(steps)]
    return [*turns, {"content": "done"}]


def limits(steps: int) -> dict[str, Any]:
    """Limits no run of ``steps`` steps reaches (the issue's, raised for longer runs)."""
    calls = max(1000, steps + 10)
    return {
        "max_steps": calls,
        "max_tool_calls": calls,
        "max_spend_usd": 1000,
        "max_elapsed_ms": 10**9,
    }


# The runs ask for more than the default cap on limits (TETHER_MAX_LIMITS) allows.
CAP = Limits(max_steps=100_000, max_spend_usd=1e6, max_tool_calls=1_000_000, max_elapsed_ms=10**9)


def bench_engine(url: str, model: StampedModel, keyring: Keyring | None = None) -> Engine:
    agent = Agent(name="bench", system_prompt="You fetch records.", tools=(fetch,))
    return Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=url, max_limits=CAP, keyring=keyring),
        notifier=MemoryNotifier(),
        migrate=True,
    )


def time_store_writes(engine: Engine) -> list[float]:
    """Wrap the step write of this engine's store; the seconds of each call, in order (a
    read-only step is one ``persist_turn``; the final answer is one more)."""
    spans: list[float] = []
    method = engine.runner.store.persist_turn

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        method(*args, **kwargs)
        spans.append(time.perf_counter() - start)

    # ``tether._runtime.hop`` finds the store's thread pool and retry window through ``__self__``.
    call.__self__ = engine.runner.store  # type: ignore[attr-defined]
    engine.runner.store.persist_turn = call  # type: ignore[method-assign]
    return spans


# -- measuring a database ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Footprint:
    """Bytes of some tables (page bytes with indexes, live row bytes) and a counter of
    bytes written; the difference of two is what the work between them added."""

    pages: dict[str, int]
    rows: dict[str, int]
    written: int | None

    def minus(self, before: Footprint) -> Footprint:
        return Footprint(
            pages={t: n - before.pages[t] for t, n in self.pages.items()},
            rows={t: n - before.rows[t] for t, n in self.rows.items()},
            written=None
            if self.written is None or before.written is None
            else self.written - before.written,
        )

    def plus(self, other: Footprint) -> Footprint:
        return Footprint(
            pages={t: n + other.pages[t] for t, n in self.pages.items()},
            rows={t: n + other.rows[t] for t, n in self.rows.items()},
            written=None
            if self.written is None or other.written is None
            else self.written + other.written,
        )


_SQLITE_BYTES = sa.text(
    "SELECT s.tbl_name, SUM(d.pgsize), SUM(CASE WHEN d.name = s.tbl_name THEN d.payload END)"
    " FROM dbstat d JOIN sqlite_schema s ON d.name = s.name"
    " WHERE s.tbl_name IN :names GROUP BY s.tbl_name"
).bindparams(sa.bindparam("names", expanding=True))


def footprint(db: DbEngine, tables: Sequence[str]) -> Footprint:
    """The bytes ``tables`` take now, and the written-bytes counter."""
    pages: dict[str, int] = dict.fromkeys(tables, 0)
    rows: dict[str, int] = dict.fromkeys(tables, 0)
    with db.connect() as conn:
        if db.dialect.name == "sqlite":
            for name, page_bytes, row_bytes in conn.execute(_SQLITE_BYTES, {"names": tables}):
                pages[name], rows[name] = int(page_bytes or 0), int(row_bytes or 0)
        else:
            for name in tables:
                pages[name] = int(
                    conn.execute(
                        sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": name}
                    ).scalar_one()
                )
                rows[name] = int(
                    conn.execute(
                        sa.text(f'SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM "{name}" t')
                    ).scalar_one()
                )
    return Footprint(pages=pages, rows=rows, written=written_bytes(db))


def written_bytes(db: DbEngine) -> int | None:
    """A counter of bytes written: the WAL position on PostgreSQL; on SQLite, the bytes this
    process handed to ``write()`` (None where ``/proc`` is missing)."""
    if db.dialect.name == "sqlite":
        try:
            io = Path("/proc/self/io").read_text()
        except OSError:
            return None
        return next(int(line.split()[1]) for line in io.splitlines() if line.startswith("wchar"))
    with db.connect() as conn:
        lsn = conn.execute(sa.text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one()
    return int(lsn)


def checkpoint(db: DbEngine) -> None:
    """On SQLite, copy the WAL into the database file now, so the block measured next
    writes (and is charged for) the checkpoint of its own pages only. RESTART, not TRUNCATE:
    the WAL file keeps its size, as between automatic checkpoints."""
    if db.dialect.name == "sqlite":
        # On the driver's connection: tether's engine opens every transaction with BEGIN
        # IMMEDIATE, and a checkpoint cannot run inside one.
        raw = db.raw_connection()
        try:
            raw.cursor().execute("PRAGMA wal_checkpoint(RESTART)")
        finally:
            raw.close()


@contextmanager
def measured(db: DbEngine, tables: Sequence[str], into: list[Footprint]) -> Iterator[None]:
    """Append to ``into`` what the block added to ``tables`` and what it wrote."""
    checkpoint(db)
    before = footprint(db, tables)
    yield
    checkpoint(db)
    into.append(footprint(db, tables).minus(before))


# -- one trial ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One repeat, on one fresh database."""

    steps: list[float]  # seconds per tether step, in order
    store: list[float]  # of which inside its two store transactions
    floor: list[float]  # seconds per floor transaction (2 INSERTs + UPDATE)
    floor2: list[float]  # seconds per single-INSERT commit (for information)
    tether_bytes: Footprint
    floor_bytes: Footprint


def run_floor(db: DbEngine, steps: int, *, pairs: bool) -> list[float]:
    """``steps`` iterations of the floor: one transaction that INSERTs the step's two
    messages (a small turn row, then the payload) and UPDATEs a counters row (with
    ``pairs``, for information: one INSERT commit of the payload alone); the seconds of
    each."""
    times: list[float] = []
    with db.begin() as conn:
        if conn.execute(sa.select(COUNTERS.c.id)).first() is None:
            conn.execute(COUNTERS.insert().values(id=1, steps=0))
    for i in range(steps):
        text = payload_text(i)
        start = time.perf_counter()
        if pairs:
            with db.begin() as conn:
                conn.execute(INSERT_FLOOR2, {"payload": text})
        else:
            with db.begin() as conn:
                conn.execute(INSERT_FLOOR, [{"payload": TURN_ROW}, {"payload": text}])
                conn.execute(COUNT_STEP)
        times.append(time.perf_counter() - start)
    return times


async def run_tether(
    engine: Engine, model: StampedModel, steps: int
) -> tuple[list[float], list[float]]:
    """Carry one scripted run to its answer; the seconds of each tool step, and of the two
    store transactions within it."""
    spans = time_store_writes(engine)
    run = await engine.start_run("bench", "fetch everything", limits=limits(steps))
    outcome = await engine.run_until_stop(run.id)
    if outcome.kind is not StopKind.ANSWERED or len(model.starts) != steps + 1:
        raise RuntimeError(f"run stopped {outcome.kind.value} after {len(model.starts)} turns")
    per_step = [b - a for a, b in pairwise(model.starts)]
    store = spans[:steps]  # one write per read-only step (the last span is the answer)
    return per_step, store


def trial(url: str, steps: int, keyring: Keyring | None = None) -> Trial:
    """A tether run bracketed by the floors (half of each before it, half after, so load
    that varies over time weighs on both alike), on the fresh database at ``url``; its
    content sealed with ``keyring`` when given."""
    model = StampedModel(script(steps))
    engine = bench_engine(url, model, keyring)
    asyncio.run(engine.open())  # the schema is built when the engine opens, not by its constructor
    db = create_db_engine(url)
    halves = (steps // 2, steps - steps // 2)
    floor_bytes: list[Footprint] = []
    tether_bytes: list[Footprint] = []
    try:
        floor_metadata.create_all(db)
        with measured(db, [FLOOR.name], floor_bytes):
            floor = run_floor(db, halves[0], pairs=False)
        floor2 = run_floor(db, halves[0], pairs=True)
        with measured(db, TETHER_TABLES, tether_bytes):
            per_step, store = asyncio.run(run_tether(engine, model, steps))
        floor2 += run_floor(db, halves[1], pairs=True)
        with measured(db, [FLOOR.name], floor_bytes):
            floor += run_floor(db, halves[1], pairs=False)
    finally:
        db.dispose()
        engine.close()
    return Trial(
        steps=per_step,
        store=store,
        floor=floor,
        floor2=floor2,
        tether_bytes=tether_bytes[0],
        floor_bytes=floor_bytes[0].plus(floor_bytes[1]),
    )


# -- databases ---------------------------------------------------------------------------


@contextmanager
def sqlite_database() -> Iterator[str]:
    """A database file in a temporary directory (on disk, so commits really fsync)."""
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        yield f"sqlite:///{tmp}/bench.db"


@contextmanager
def postgresql_database() -> Iterator[str]:
    """A temporary database on the local server, dropped afterwards."""
    name = f"tether_bench_{uuid.uuid4().hex[:12]}"
    admin = create_db_engine(PG_ADMIN_URL).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        yield f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.engine.dispose()


DATABASES: dict[str, Callable[[], AbstractContextManager[str]]] = {
    "sqlite": sqlite_database,
    "postgresql": postgresql_database,
}


# -- the report --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Figures:
    """One trial's figures (milliseconds, bytes per step)."""

    early_ms: float
    late_ms: float
    step_ms: float
    store_ms: float
    loop_ms: float
    floor_ms: float
    floor2_ms: float
    tether_pages: float
    floor_pages: float
    tether_rows: float
    floor_rows: float
    tether_written: float | None
    floor_written: float | None
    by_table: dict[str, float]

    @classmethod
    def of(cls, t: Trial) -> Figures:
        n = len(t.steps)
        return cls(
            early_ms=_ms(t.steps[:WINDOW]),
            late_ms=_ms(t.steps[-WINDOW:]),
            step_ms=_ms(t.steps),
            store_ms=_ms(t.store),
            loop_ms=_ms([s - w for s, w in zip(t.steps, t.store, strict=True)]),
            floor_ms=_ms(t.floor),
            floor2_ms=_ms(t.floor2),
            tether_pages=sum(t.tether_bytes.pages.values()) / n,
            floor_pages=sum(t.floor_bytes.pages.values()) / n,
            tether_rows=sum(t.tether_bytes.rows.values()) / n,
            floor_rows=sum(t.floor_bytes.rows.values()) / n,
            tether_written=_per_step(t.tether_bytes.written, n),
            floor_written=_per_step(t.floor_bytes.written, n),
            by_table={k: v / n for k, v in t.tether_bytes.pages.items()},
        )


def _ms(seconds: Sequence[float]) -> float:
    return statistics.median(seconds) * 1000


def _per_step(total: int | None, n: int) -> float | None:
    return None if total is None else total / n


def _median_of(figs: Sequence[Figures], get: Callable[[Figures], float | None]) -> float:
    values = [v for v in (get(f) for f in figs) if v is not None]
    return statistics.median(values) if values else float("nan")


def _verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "MISS"


def _line(label: str, value: str, target: float | None = None, ratio: float = 0.0) -> str:
    check = f"  <= {target:<5g} {_verdict(ratio, target)}" if target is not None else ""
    return f"  {label:<50}{value:>20}{check}"


def _timing_lines(figs: Sequence[Figures], steps: int) -> list[str]:
    def med(get: Callable[[Figures], float | None]) -> float:
        return _median_of(figs, get)

    early, late, step = (
        med(lambda f: f.early_ms),
        med(lambda f: f.late_ms),
        med(lambda f: f.step_ms),
    )
    floor, floor2 = med(lambda f: f.floor_ms), med(lambda f: f.floor2_ms)
    return [
        _line("tether step, median of steps 1-10", f"{early:.3f} ms"),
        _line(f"tether step, median of steps {steps - WINDOW + 1}-{steps}", f"{late:.3f} ms"),
        _line("late / early", f"{late / early:.2f}x", TARGET_LATE_EARLY, late / early),
        _line("tether step, median of all steps", f"{step:.3f} ms"),
        _line("  inside its store transaction", f"{med(lambda f: f.store_ms):.3f} ms"),
        _line(
            "  outside it (thread hop, loop, model, tool)",
            f"{med(lambda f: f.loop_ms):.3f} ms",
        ),
        _line("floor: 1 transaction (2 INSERTs + UPDATE) per step", f"{floor:.3f} ms"),
        _line("for information: 1 INSERT commit per step", f"{floor2:.3f} ms"),
        _line("tether step / floor", f"{step / floor:.2f}x", TARGET_FLOOR, step / floor),
    ]


def _bytes_lines(figs: Sequence[Figures], backend: str) -> list[str]:
    def med(get: Callable[[Figures], float | None]) -> float:
        return _median_of(figs, get)

    t_pages, f_pages = med(lambda f: f.tether_pages), med(lambda f: f.floor_pages)
    t_rows, f_rows = med(lambda f: f.tether_rows), med(lambda f: f.floor_rows)
    t_written, f_written = med(lambda f: f.tether_written), med(lambda f: f.floor_written)
    written = "write() bytes" if backend == "sqlite" else "WAL bytes (cluster-wide)"
    by_table = {k: statistics.median(f.by_table[k] for f in figs) for k in TETHER_TABLES}
    return [
        _line("stored bytes per step (table+index pages): tether", f"{t_pages:,.0f} B"),
        _line("stored bytes per step (table+index pages): floor", f"{f_pages:,.0f} B"),
        _line(
            "stored bytes tether / floor",
            f"{t_pages / f_pages:.2f}x",
            TARGET_BYTES,
            t_pages / f_pages,
        ),
        _line(
            "live row bytes per step: tether / floor",
            f"{t_rows:,.0f} / {f_rows:,.0f} B = {t_rows / f_rows:.2f}x",
        ),
        _line(f"{written} per step: tether / floor", f"{t_written:,.0f} / {f_written:,.0f} B"),
        "  tether stored bytes per step by table: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(by_table.items(), key=lambda kv: -kv[1])),
    ]


def report(backend: str, steps: int, trials: Sequence[Trial], load: float) -> str:
    """One backend's table: medians across trials, each target with PASS or MISS."""
    figs = [Figures.of(t) for t in trials]
    size = len(payload_text(0))
    head = (
        f"{backend}: {steps} steps, {size:,}-byte tool result, medians of {len(trials)}"
        f" repeat(s), load average {load:.2f} at start"
    )
    return "\n".join([head, *_timing_lines(figs, steps), *_bytes_lines(figs, backend)])


def _trial_line(i: int, t: Trial) -> str:
    f = Figures.of(t)
    return (
        f"  repeat {i}: steps 1-10 {f.early_ms:.3f} ms, last 10 {f.late_ms:.3f} ms,"
        f" all {f.step_ms:.3f} ms (store {f.store_ms:.3f}), floor {f.floor_ms:.3f} ms,"
        f" 1-INSERT commit {f.floor2_ms:.3f} ms,"
        f" stored {f.tether_pages:,.0f} / {f.floor_pages:,.0f} B"
    )


# -- the command -------------------------------------------------------------------------


def measure(backend: str, steps: int, repeat: int) -> None:
    """Run ``repeat`` trials on ``backend``, each on a fresh database, and print them."""
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        print(f"warning: load average {load:.2f}: other work on this machine makes timings noisy")
    trials: list[Trial] = []
    for i in range(repeat):
        with DATABASES[backend]() as url:
            trials.append(trial(url, steps))
        print(_trial_line(i + 1, trials[-1]), flush=True)
    print(report(backend, steps, trials, load), flush=True)


def measure_sealed(backend: str, steps: int, repeat: int) -> None:
    """Trials with content sealed (a fresh AES-256 key, reference §20) and in the clear,
    alternating so load that varies over time weighs on both; their step times and stored
    bytes per step, and sealed / clear (targets: <= 1.1 and <= 1.05)."""
    keyring = parse_keys(f"bench:{new_key()}")
    load = os.getloadavg()[0]
    runs: dict[str, list[Figures]] = {"clear": [], "sealed": []}
    for i in range(repeat):
        for name, ring in (("clear", None), ("sealed", keyring)):
            with DATABASES[backend]() as url:
                runs[name].append(Figures.of(trial(url, steps, ring)))
            print(f"  repeat {i + 1} {name}: step {runs[name][-1].step_ms:.3f} ms", flush=True)
    print(
        f"{backend}: sealed against clear, {steps} steps, medians of {repeat} repeat(s), "
        f"load average {load:.2f} at start"
    )
    for label, get, target in (
        ("ms per step", lambda f: f.step_ms, 1.1),
        ("  in the store's transaction", lambda f: f.store_ms, None),
        ("stored bytes per step", lambda f: f.tether_pages, 1.05),
        ("  live row bytes per step", lambda f: f.tether_rows, None),
    ):
        clear = _median_of(runs["clear"], get)
        sealed = _median_of(runs["sealed"], get)
        ratio = sealed / clear
        verdict = "" if target is None else f" (target <= {target}: {_verdict(ratio, target)})"
        print(f"  {label}: clear {clear:,.3f}, sealed {sealed:,.3f}, {ratio:.3f}x{verdict}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="tether's per-step overhead against a floor.")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument(
        "--sealed", action="store_true", help="compare content sealed at rest with clear"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 2 * WINDOW or args.repeat < 1:
        parser.error(f"--steps must be at least {2 * WINDOW} and --repeat at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if args.sealed:
            measure_sealed(backend, args.steps, args.repeat)
        else:
            measure(backend, args.steps, args.repeat)
        print()


if __name__ == "__main__":
    main()
