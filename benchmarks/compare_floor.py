"""The floor of ``compare.py``: the least a durable agent step can cost on each backend.

One transaction per step, through the raw driver (``sqlite3`` or ``psycopg``): INSERT the
step's messages (the assistant turn and the tool result, as OpenAI-format JSON text) and
UPDATE the run's counters row. The run's start is one more transaction (the counters row,
the system and user messages). SQLite: WAL, ``synchronous=FULL``; PostgreSQL:
``synchronous_commit=on``.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from typing import Any

import psycopg
from compare_common import (
    NEVER,
    SYSTEM_PROMPT,
    WARMUP_STEPS,
    Database,
    Resumed,
    Sample,
    assistant_turn,
    call_id,
    expect,
    expect_result,
    query,
    question,
    scalar,
    stored_bytes,
    tool_text,
    verdict,
)

SCHEMA = (
    "CREATE TABLE floor_runs (run_id VARCHAR(64) PRIMARY KEY, steps INTEGER NOT NULL,"
    " messages INTEGER NOT NULL)",
    "CREATE TABLE floor_messages (run_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL,"
    " message TEXT NOT NULL, PRIMARY KEY (run_id, seq))",
)


class FloorStore:
    """The floor's two tables over one connection of the raw driver."""

    def __init__(self, db: Database) -> None:
        self.sqlite = db.backend == "sqlite"
        if self.sqlite:
            self.lite = sqlite3.connect(db.path, isolation_level=None)  # explicit BEGIN
            self.lite.execute("PRAGMA synchronous=FULL")
            if self.lite.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                raise RuntimeError("the floor's database is not in WAL mode")
        else:
            self.pg = psycopg.connect(db.url, autocommit=True)  # explicit transactions

    def close(self) -> None:
        if self.sqlite:
            self.lite.close()
        else:
            self.pg.close()

    def _transaction(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """One commit of ``statements`` (``?`` placeholders)."""
        if self.sqlite:
            self.lite.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                self.lite.execute(sql, params)
            self.lite.execute("COMMIT")
        else:
            with self.pg.transaction():
                for sql, params in statements:
                    self.pg.execute(sql.replace("?", "%s"), params)

    def create_schema(self) -> None:
        self._transaction([(sql, ()) for sql in SCHEMA])

    def start(self, run_id: str, text: str) -> None:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        self._transaction(
            [
                ("INSERT INTO floor_runs VALUES (?, 0, ?)", (run_id, len(messages))),
                *self._inserts(run_id, 0, messages),
            ]
        )

    def step(self, run_id: str, seq: int, messages: list[dict[str, Any]]) -> None:
        """Store one step's messages from position ``seq`` on, and count the step."""
        self._transaction(
            [
                *self._inserts(run_id, seq, messages),
                (
                    "UPDATE floor_runs SET steps = steps + 1, messages = messages + ?"
                    " WHERE run_id = ?",
                    (len(messages), run_id),
                ),
            ]
        )

    @staticmethod
    def _inserts(
        run_id: str, seq: int, messages: list[dict[str, Any]]
    ) -> list[tuple[str, tuple[Any, ...]]]:
        return [
            ("INSERT INTO floor_messages VALUES (?, ?, ?)", (run_id, seq + i, json.dumps(m)))
            for i, m in enumerate(messages)
        ]

    def load(self, run_id: str) -> list[dict[str, Any]]:
        """The run's messages, in order."""
        sql = "SELECT message FROM floor_messages WHERE run_id = ? ORDER BY seq"
        if self.sqlite:
            rows = self.lite.execute(sql, (run_id,)).fetchall()
        else:
            rows = self.pg.execute(sql.replace("?", "%s"), (run_id,)).fetchall()
        return [json.loads(row[0]) for row in rows]


def take_step(store: FloorStore, run_id: str, assistant_turns: int, seq: int, steps: int) -> int:
    """The model's next turn and, if it asks for one, the tool's result, in one commit;
    the number of messages stored."""
    turn = assistant_turn(assistant_turns, steps)
    messages = [turn]
    if turn.get("tool_calls"):
        n = json.loads(turn["tool_calls"][0]["function"]["arguments"])["n"]
        messages.append({"role": "tool", "tool_call_id": call_id(n), "content": tool_text(n)})
    store.step(run_id, seq, messages)
    return len(messages)


def run(store: FloorStore, steps: int, *, until: int | None = None) -> str:
    """A run of ``steps`` steps (or only its first ``until``); its id."""
    run_id = uuid.uuid4().hex
    store.start(run_id, question(steps))
    seq = 2
    for i in range(steps if until is None else until):
        seq += take_step(store, run_id, i, seq, steps)
    return run_id


def check(db: Database, run_id: str, steps: int, messages: int, last_n: int) -> list[str]:
    """Counted in the database: ``steps`` steps and ``messages`` messages stored, and the
    last tool result (of ``fetch(last_n)``) whole."""
    failures: list[str] = []
    rows = query(db, "SELECT message FROM floor_messages WHERE run_id = :r ORDER BY seq", r=run_id)
    expect(failures, "stored messages", len(rows), messages)
    expect(
        failures,
        "counted steps",
        scalar(db, "SELECT steps FROM floor_runs WHERE run_id = :r", r=run_id),
        steps,
    )
    tools = [m["content"] for m in (json.loads(text) for (text,) in rows) if m["role"] == "tool"]
    expect_result(failures, tools[-1] if tools else None, last_n)
    return failures


def measure(system: str, db: Database, steps: int) -> Sample:
    store = FloorStore(db)
    try:
        store.create_schema()
        run(store, WARMUP_STEPS)
        before = stored_bytes(db)
        start = time.perf_counter()
        run_id = run(store, steps)
        seconds = time.perf_counter() - start
        stored = stored_bytes(db) - before
    finally:
        store.close()
    # system, user, then each step's assistant turn and (but the last) its tool result
    failures = check(db, run_id, steps, 2 + 2 * steps - 1, steps - 2)
    return Sample.checked(system, db, steps, seconds, stored, failures)


def prepare(system: str, db: Database, steps: int) -> str:
    """A stored run of ``steps`` tool steps whose model would go on."""
    store = FloorStore(db)
    try:
        store.create_schema()
        return run(store, NEVER, until=steps)
    finally:
        store.close()


def resume(system: str, db: Database, key: str, steps: int) -> Resumed:
    """Open the database, load the run's history, take the next step."""
    failures = check(db, key, steps, 2 + 2 * steps, steps - 1)
    start = time.perf_counter()
    store = FloorStore(db)
    history = store.load(key)
    turns = sum(1 for m in history if m["role"] == "assistant")
    take_step(store, key, turns, len(history), NEVER)
    seconds = time.perf_counter() - start
    store.close()
    failures += check(db, key, steps + 1, 2 + 2 * (steps + 1), steps)
    return Resumed(system=system, backend=db.backend, seconds=seconds, check=verdict(failures))
