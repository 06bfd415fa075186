"""Storage by reference: what a long thread stores, and what a late follow-up costs to start.

One thread of ``--follow-ups`` (default 200) follow-ups after its first run is built
through the real engine (``start_run(..., thread_id=...)`` then ``run_until_stop``) on
SQLite (a temp file: WAL, ``synchronous=FULL``) and on PostgreSQL (a temporary database,
``synchronous_commit=on``, dropped at the end). The model answers each question at once
with ~4 KB of text (``ANSWER_CHARS`` characters of random lowercase words: poorly
compressible, so PostgreSQL's TOAST compression does not flatter the bytes). So each
follow-up adds its question and one ~4 KB answer to the conversation, and the model is
handed the whole conversation so far at each follow-up (checked).

Printed per backend, as medians across ``--repeat`` repeats, each on a fresh database:

* **stored bytes**: what the thread added to the database, against the bytes of its
  messages (the sum of ``len(canonical JSON)`` of every message of the thread's
  conversation, as ``get_thread`` returns it). Stored is the growth of the tables with
  their indexes and TOAST (SQLite: ``dbstat`` page bytes, which read through the WAL;
  PostgreSQL: ``pg_total_relation_size``), measured from after a warm-up thread to after
  the measured one; for ``run_messages`` alone (the conversation's own rows) and for every
  table (the runs, the threads row, the trace events, the ledger). The issue's goal
  (<= 1.2x) is judged on every table, the whole of what the thread costs; the messages
  alone are printed beside it, with the live row bytes (SQLite: ``dbstat`` payload;
  PostgreSQL: ``pg_column_size`` of the rows) and the bytes per run by table.
* **a follow-up's start**: from just before ``run_until_stop`` (the claim) to the start
  of the run's first model call (the model stamps it), for the first ``--window``
  follow-ups and for the last ``--window``; split into the claim, the store's snapshot
  (the run with the thread's conversation through it: one statement,
  ``Reads.snapshot(history=True)``) and the rest of the session's start (scope, the
  follow-up's first messages). Against one **plain read** of the messages the last
  follow-up read (the same rows, the same bytes): one SELECT of the message column as
  text, on the driver's cursor of a pooled connection of the same engine settings, in the
  same process (median of ``READS`` reads after one warm-up), and the same read with each
  message decoded from JSON (what a follow-up must hand its model). Goal: t(last) <=
  t(first) + 1.5 x t(read), the history read once, never per run or per message; judged
  against both reads (on SQLite decoding alone takes about three times the fetch).

A warm-up thread of ``WARM_UP`` runs comes first on each database, so the first measured
follow-ups do not pay for compiling statements or filling caches. Figures are printed,
never asserted; the load average is printed with each table. Run it from the repository
root::

    .venv/bin/python benchmarks/threads.py [--backend sqlite|postgresql|both]
        [--follow-ups 200] [--repeat 3] [--window 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import random
import statistics
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine as DbEngine
from step_overhead import BUSY_LOAD, DATABASES, TETHER_TABLES, Footprint, footprint

from tether import Agent, Engine, MemoryNotifier, Settings, StopKind
from tether.messages import canonical_json
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.store.backend.connect import create_db_engine

ANSWER_CHARS = 4000
WARM_UP = 4  # runs of the warm-up thread
READS = 11  # plain reads timed, after one warm-up read
TARGET_BYTES = 1.2
TARGET_READS = 1.5
USER = "bench"


# -- the model ---------------------------------------------------------------------------


def answers(chars: int) -> list[str]:
    """The model's answers, made before anything is timed (it answers at once): 64
    distinct texts of ``chars`` characters of random lowercase words."""
    texts = []
    for n in range(64):
        rng = random.Random(n)
        words: list[str] = []
        size = 0
        while size < chars:
            word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10)))
            words.append(word)
            size += len(word) + 1
        texts.append(" ".join(words)[:chars])
    return texts


class GcClock:
    """The seconds this process has spent in the garbage collector (any thread)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


class StampedAnswers(Model):
    """Answers every question at once with ~4 KB of text; stamps the start of each call
    (with the collector's clock) and keeps how many messages it was handed."""

    name = "stamped"

    def __init__(self, gc_clock: GcClock, texts: list[str]) -> None:
        self.gc = gc_clock
        self.texts = texts
        self.starts: list[float] = []
        self.gc_at: list[float] = []
        self.handed: list[int] = []

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.starts.append(time.perf_counter())
        self.gc_at.append(self.gc.seconds)
        self.handed.append(len(messages))
        n = len(self.starts)
        return ModelResponse(
            message={"role": "assistant", "content": f"{n} {self.texts[n % len(self.texts)]}"},
            usage=Usage(input_tokens=10, output_tokens=5),
            model="scripted",
        )


def bench_engine(url: str, model: StampedAnswers) -> Engine:
    agent = Agent(name="bench", system_prompt="You answer at length.", tools=())
    return Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
        migrate=True,
    )


@dataclass
class Spans:
    """The parts of one follow-up's start, in seconds: the claim, then the store's
    snapshot inside the session's start."""

    claims: list[float]
    snapshots: list[float]


def time_parts(engine: Engine) -> Spans:
    """Wrap this engine's claim and its store's snapshot; each call's seconds, in order."""
    spans = Spans(claims=[], snapshots=[])
    runner = engine.runner
    claim = runner.claim

    @functools.wraps(claim)
    async def timed_claim(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await claim(*args, **kwargs)
        finally:
            spans.claims.append(time.perf_counter() - start)

    runner.claim = timed_claim  # type: ignore[method-assign]
    store = engine.runner.store
    snapshot = store.snapshot

    @functools.wraps(snapshot)
    def timed_snapshot(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return snapshot(*args, **kwargs)
        finally:
            spans.snapshots.append(time.perf_counter() - start)

    # ``tether._runtime.hop`` finds the store's thread pool and retry window through ``__self__``.
    timed_snapshot.__self__ = store  # type: ignore[attr-defined]
    store.snapshot = timed_snapshot  # type: ignore[method-assign]
    return spans


# -- the thread --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Start:
    """One follow-up's start, in seconds."""

    total: float  # from just before ``run_until_stop`` to its first model call
    claim: float
    snapshot: float
    gc: float  # in the garbage collector meanwhile


async def ask(engine: Engine, model: StampedAnswers, spans: Spans, thread: str | None) -> Any:
    """One run of ``thread`` (a new thread when None), carried to its answer; the run and
    how its start went."""
    run = await engine.start_run(USER, f"question {len(model.starts) + 1}", thread_id=thread)
    calls, snapshots = len(model.starts), len(spans.snapshots)
    collected = model.gc.seconds
    start = time.perf_counter()
    outcome = await engine.run_until_stop(run.id)
    if outcome.kind is not StopKind.ANSWERED or len(model.starts) != calls + 1:
        raise RuntimeError(f"run {run.id} stopped {outcome.kind.value}")
    timing = Start(
        total=model.starts[-1] - start,
        claim=spans.claims[-1],
        snapshot=sum(spans.snapshots[snapshots:]),
        gc=model.gc_at[-1] - collected,
    )
    return run, timing


async def build_thread(
    engine: Engine,
    model: StampedAnswers,
    spans: Spans,
    follow_ups: int,
    halfway: Callable[[], None] = lambda: None,
) -> tuple[str, list[Start], int]:
    """The thread's first run then ``follow_ups`` follow-ups (``halfway`` called after
    half of them); the thread, each follow-up's start, and the place of the last one.
    Checks that each follow-up was handed the whole conversation: the system message,
    two messages a run before it, its question."""
    first, _ = await ask(engine, model, spans, None)
    starts: list[Start] = []
    place = 1
    for k in range(1, follow_ups + 1):
        run, timing = await ask(engine, model, spans, first.thread_id)
        place = run.thread_pos
        if model.handed[-1] != 1 + 2 * k + 1:
            raise RuntimeError(f"follow-up {k} was handed {model.handed[-1]} messages")
        starts.append(timing)
        if k == follow_ups // 2:
            halfway()
    return first.thread_id, starts, place


# -- the plain read ----------------------------------------------------------------------

_PLAIN_READ = {
    "sqlite": (
        "SELECT m.message FROM run_messages m JOIN runs r ON r.id = m.run_id"
        " WHERE r.thread_id = ? AND r.thread_pos < ? ORDER BY r.thread_pos, m.seq"
    ),
    "postgresql": (
        "SELECT m.message::text FROM run_messages m JOIN runs r ON r.id = m.run_id"
        " WHERE r.thread_id = %s AND r.thread_pos < %s ORDER BY r.thread_pos, m.seq"
    ),
}


def plain_reads(db: DbEngine, thread: str, before: int) -> tuple[list[float], list[float], int]:
    """Seconds of ``READS`` plain SELECTs of the messages of the thread's runs before place
    ``before`` (the same rows a follow-up at that place reads as its history), and of as
    many with each message decoded; and the bytes read."""
    sql = _PLAIN_READ[db.dialect.name]
    raw = db.raw_connection()
    try:
        cursor = raw.cursor()

        def read(decode: bool) -> tuple[float, int]:
            start = time.perf_counter()
            cursor.execute(sql, (thread, before))
            rows = cursor.fetchall()
            if decode:
                [json.loads(text) for (text,) in rows]
            seconds = time.perf_counter() - start
            if db.dialect.name == "sqlite":
                raw.rollback()
            return seconds, sum(len(text.encode()) for (text,) in rows)

        read(False), read(True)  # warm-up
        plain = [read(False)[0] for _ in range(READS)]
        decoded = [read(True)[0] for _ in range(READS)]
        size = read(False)[1]
    finally:
        raw.close()
    return plain, decoded, size


# -- one trial ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One repeat, on one fresh database."""

    starts: list[Start]
    plain: list[float]
    decoded: list[float]
    read_bytes: int
    message_bytes: int
    messages: int
    runs: int
    stored: Footprint
    halves: tuple[int, int]  # stored page bytes of the first and second half of the follow-ups


async def run_trial(url: str, follow_ups: int, answer_chars: int) -> Trial:
    model = StampedAnswers(GcClock(), answers(answer_chars))
    engine = bench_engine(url, model)
    await engine.open()
    spans = time_parts(engine)
    db = create_db_engine(url)
    try:
        await build_thread(engine, model, spans, WARM_UP - 1)
        before = footprint(db, TETHER_TABLES)
        marks: list[Footprint] = []
        thread, starts, last = await build_thread(
            engine, model, spans, follow_ups, lambda: marks.append(footprint(db, TETHER_TABLES))
        )
        after = footprint(db, TETHER_TABLES)
        stored = after.minus(before)
        halves = (
            sum(marks[0].minus(before).pages.values()),
            sum(after.minus(marks[0]).pages.values()),
        )
        view = await engine.get_thread(thread, user=USER)
        conversation, runs = view.messages or [], len(view.runs)
        plain, decoded, read_bytes = plain_reads(db, thread, last)
    finally:
        db.dispose()
        await engine.aclose()
        model.gc.close()
    return Trial(
        starts=starts,
        plain=plain,
        decoded=decoded,
        read_bytes=read_bytes,
        message_bytes=sum(len(canonical_json(m).encode()) for m in conversation),
        messages=len(conversation),
        runs=runs,
        stored=stored,
        halves=halves,
    )


# -- the report ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Figures:
    """One trial's figures (milliseconds, bytes)."""

    early: dict[str, float]  # the first follow-ups' starts: medians (and the GC's mean)
    late: dict[str, float]  # the last ones'
    read_ms: float
    decoded_ms: float
    read_bytes: int
    message_bytes: int
    messages: int
    runs: int
    all_pages: int
    messages_pages: int
    all_rows: int
    messages_rows: int
    by_table: dict[str, float]
    halves: float  # stored by the second half of the follow-ups / by the first half

    @classmethod
    def of(cls, t: Trial, window: int) -> Figures:
        return cls(
            early=_starts(t.starts[:window]),
            late=_starts(t.starts[-window:]),
            read_ms=_ms(t.plain),
            decoded_ms=_ms(t.decoded),
            read_bytes=t.read_bytes,
            message_bytes=t.message_bytes,
            messages=t.messages,
            runs=t.runs,
            all_pages=sum(t.stored.pages.values()),
            messages_pages=t.stored.pages["run_messages"],
            all_rows=sum(t.stored.rows.values()),
            messages_rows=t.stored.rows["run_messages"],
            by_table={k: v / t.runs for k, v in t.stored.pages.items()},
            halves=t.halves[1] / t.halves[0],
        )


def _starts(starts: Sequence[Start]) -> dict[str, float]:
    return {
        "total": _ms([s.total for s in starts]),
        "claim": _ms([s.claim for s in starts]),
        "snapshot": _ms([s.snapshot for s in starts]),
        "gc": statistics.mean(s.gc for s in starts) * 1000,
    }


def _ms(seconds: Sequence[float]) -> float:
    return statistics.median(seconds) * 1000


def _verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "MISS"


def _line(label: str, value: str, verdict: str = "") -> str:
    return f"  {label:<58}{value:>26}  {verdict}".rstrip()


def _bytes_lines(figs: Sequence[Figures]) -> list[str]:
    def med(get: Callable[[Figures], float]) -> float:
        return statistics.median(get(f) for f in figs)

    msg_bytes = med(lambda f: f.message_bytes)
    all_pages, msg_pages = med(lambda f: f.all_pages), med(lambda f: f.messages_pages)
    all_rows, msg_rows = med(lambda f: f.all_rows), med(lambda f: f.messages_rows)
    by_table = {k: statistics.median(f.by_table[k] for f in figs) for k in TETHER_TABLES}
    return [
        _line(
            "conversation: messages / canonical JSON bytes",
            f"{med(lambda f: f.messages):,.0f} / {msg_bytes:,.0f} B",
        ),
        _line(
            "stored, every table (pages, indexes, TOAST) / messages",
            f"{all_pages:,.0f} B = {all_pages / msg_bytes:.2f}x",
            f"<= {TARGET_BYTES:g} {_verdict(all_pages / msg_bytes, TARGET_BYTES)}",
        ),
        _line(
            "stored, run_messages alone / messages",
            f"{msg_pages:,.0f} B = {msg_pages / msg_bytes:.2f}x",
            f"({_verdict(msg_pages / msg_bytes, TARGET_BYTES)} on the messages alone)",
        ),
        _line(
            "live row bytes / messages: every table, run_messages",
            f"{all_rows / msg_bytes:.2f}x, {msg_rows / msg_bytes:.2f}x",
        ),
        _line(
            "stored by the second half of the follow-ups / the first",
            f"{med(lambda f: f.halves):.2f}x",
            "(a copied history would give about 3x)",
        ),
        "  stored bytes per run by table: "
        + ", ".join(
            f"{k} {v:,.0f}" for k, v in sorted(by_table.items(), key=lambda kv: -kv[1]) if v
        ),
    ]


def _start_lines(figs: Sequence[Figures], follow_ups: int, window: int) -> list[str]:
    def med(get: Callable[[Figures], float]) -> float:
        return statistics.median(get(f) for f in figs)

    first, last = med(lambda f: f.early["total"]), med(lambda f: f.late["total"])
    read, decoded = med(lambda f: f.read_ms), med(lambda f: f.decoded_ms)
    lines = []
    for which, span in (
        ("early", f"1-{window}"),
        ("late", f"{follow_ups - window + 1}-{follow_ups}"),
    ):
        part = {
            k: statistics.median(getattr(f, which)[k] for f in figs)
            for k in ("total", "claim", "snapshot", "gc")
        }
        lines += [
            _line(f"claim -> first model call, follow-ups {span}", f"{part['total']:.2f} ms"),
            _line(
                "  of which the claim / the snapshot / GC (mean)",
                f"{part['claim']:.2f} / {part['snapshot']:.2f} / {part['gc']:.2f} ms",
            ),
        ]
    return [
        *lines,
        _line(
            f"plain read of the last one's history ({med(lambda f: f.read_bytes):,.0f} B)",
            f"{read:.2f} ms",
        ),
        _line("  the same, each message decoded from JSON", f"{decoded:.2f} ms"),
        _line(
            f"late <= early + {TARGET_READS:g} x plain read",
            f"{last:.2f} <= {first + TARGET_READS * read:.2f} ms",
            _verdict(last, first + TARGET_READS * read),
        ),
        _line(
            f"late <= early + {TARGET_READS:g} x decoded read",
            f"{last:.2f} <= {first + TARGET_READS * decoded:.2f} ms",
            _verdict(last, first + TARGET_READS * decoded),
        ),
        _line(
            "late - early, in plain / decoded reads",
            f"{(last - first) / read:.2f} / {(last - first) / decoded:.2f}",
        ),
    ]


def report(
    backend: str, follow_ups: int, window: int, answer_chars: int, trials: Sequence[Trial]
) -> str:
    """One backend's table: medians across trials, each goal with PASS or MISS."""
    figs = [Figures.of(t, window) for t in trials]
    head = (
        f"{backend}: a thread of 1 + {follow_ups} runs, {answer_chars:,}-character answers,"
        f" medians of {len(trials)} repeat(s)"
    )
    return "\n".join([head, *_bytes_lines(figs), *_start_lines(figs, follow_ups, window)])


def _trial_line(i: int, t: Trial, window: int) -> str:
    f = Figures.of(t, window)
    return (
        f"  repeat {i}: first {f.early['total']:.2f} ms, last {f.late['total']:.2f} ms"
        f" (snapshot {f.early['snapshot']:.2f} -> {f.late['snapshot']:.2f} ms,"
        f" GC {f.early['gc']:.2f} -> {f.late['gc']:.2f} ms),"
        f" read {f.read_ms:.2f} ms (decoded {f.decoded_ms:.2f}),"
        f" stored {f.all_pages / f.message_bytes:.2f}x"
        f" (run_messages {f.messages_pages / f.message_bytes:.2f}x)"
    )


# -- the command -------------------------------------------------------------------------


def measure(backend: str, follow_ups: int, repeat: int, window: int, answer_chars: int) -> None:
    """Run ``repeat`` trials on ``backend``, each on a fresh database, and print them."""
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        print(f"warning: load average {load:.2f}: other work on this machine makes timings noisy")
    started = time.perf_counter()
    trials: list[Trial] = []
    for i in range(repeat):
        with DATABASES[backend]() as url:
            trials.append(asyncio.run(run_trial(url, follow_ups, answer_chars)))
        print(_trial_line(i + 1, trials[-1], window), flush=True)
    print(report(backend, follow_ups, window, answer_chars, trials))
    print(
        f"  load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end;"
        f" {time.perf_counter() - started:.0f} s",
        flush=True,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A long thread's storage and follow-up start.")
    parser.add_argument(
        "--backend", choices=["sqlite", "postgresql", "postgres", "both"], default="both"
    )
    parser.add_argument("--follow-ups", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--answer-chars", type=int, default=ANSWER_CHARS)
    args = parser.parse_args(argv)
    if args.window < 1 or args.follow_ups < 2 * args.window or args.repeat < 1:
        parser.error("--window must be at least 1, --follow-ups at least twice it, --repeat >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    backend = "postgresql" if args.backend == "postgres" else args.backend
    for name in ["sqlite", "postgresql"] if backend == "both" else [backend]:
        measure(name, args.follow_ups, args.repeat, args.window, args.answer_chars)
        print()


if __name__ == "__main__":
    main()
