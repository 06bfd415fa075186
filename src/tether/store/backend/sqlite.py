"""SQLite's dialect: writers serialise at ``BEGIN IMMEDIATE``, so claims need no row locks
(the portable ``Dialect``'s claims), workers poll, and the step writes are the same
statements as everywhere, sent to the driver's cursor directly.

On SQLite a statement is a function call, not a round trip, so what a step write costs
beyond its COMMIT is the work around each statement: SQLAlchemy's execution layer (the
compiled cache, parameter processing, result set-up, events) was a large part of a
read-only step's five statements (benchmarks/README.md, step_overhead.py). So the
statements of ``sql/steps.py`` are compiled by SQLAlchemy once, at import, and executed
on the transaction's own driver connection with SQLAlchemy's bind processors (its JSON
serialisation included): the SQL and the stored bytes are the same.
The transaction itself (``BEGIN IMMEDIATE``, COMMIT, the commit mark of ``faults``) is
still SQLAlchemy's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.compiler import SQLCompiler

from tether.errors import LeaseLost
from tether.store.backend.connect import READ
from tether.store.backend.dialect import Dialect
from tether.store.sql.snapshots import EARLIER, OWN, Loaded, read_portable
from tether.store.sql.steps import (
    INSERT_DONE,
    INSERT_EVENT,
    INSERT_INTENT,
    INSERT_MESSAGE,
    RECORD_OUTCOME,
    RESULT,
    TURN,
    TURN_FINAL,
)

_DIALECT = sqlite.dialect()


@dataclass(frozen=True)
class Compiled:
    """A statement compiled once for SQLite: its SQL, its parameters in order, their bind
    processors and the values built into it (literal ``values()``)."""

    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    defaults: Mapping[str, Any]

    @classmethod
    def of(cls, statement: sa.ClauseElement, columns: Sequence[str] | None = None) -> Compiled:
        compiled = cast(SQLCompiler, statement.compile(dialect=_DIALECT, column_keys=columns))
        names = tuple(compiled.positiontup or ())
        processors = tuple(compiled.binds[n].type.bind_processor(_DIALECT) for n in names)
        # Values built into the statement (``values(state=...)``); a parameter without one
        # must be given (a KeyError otherwise, never a silent NULL).
        fixed = {n: b.value for n, b in compiled.binds.items() if not b.required}
        return cls(str(compiled), names, processors, fixed)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional parameters for ``params`` (by name), processed as SQLAlchemy
        would."""
        out = []
        for name, process in zip(self.names, self.processors, strict=True):
            value = params[name] if name in params else self.defaults[name]
            out.append(process(value) if process is not None else value)
        return out


_LEDGER = ("idempotency_key", "run_id", "tool_call_id", "seq", "tool", "arguments", "effect")
_TURN = {final: Compiled.of(TURN_FINAL.statement if final else TURN) for final in (False, True)}
_RESULT = Compiled.of(RESULT)
_MESSAGE = Compiled.of(INSERT_MESSAGE, ("run_id", "seq", "message"))
_INTENT = Compiled.of(INSERT_INTENT, _LEDGER)
_DONE = Compiled.of(INSERT_DONE, (*_LEDGER, "status", "result"))
_OUTCOME = Compiled.of(RECORD_OUTCOME)
_EVENT = Compiled.of(INSERT_EVENT, ("run_id", "kind", "data"))
_TEXTS = {statement: Compiled.of(statement) for statement in (OWN, EARLIER)}


def _texts(conn: Connection, statement: sa.Select[Any], run_id: str) -> list[str]:
    """A run's message texts on the driver's cursor: 400 rows through SQLAlchemy's result
    cost more than their decoding (``snapshots``)."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    compiled = _TEXTS[statement]
    return [row[-1] for row in cursor.execute(compiled.sql, compiled.args({"b_id": run_id}))]


def _fenced(cursor: Any, statement: Compiled, params: Mapping[str, Any]) -> None:
    """The lease- and seq-conditional UPDATE; ``LeaseLost`` when it matched no row."""
    if cursor.execute(statement.sql, statement.args(params)).fetchone() is None:
        raise LeaseLost("this worker no longer owns the run", run_id=params["b_id"])


def _event(cursor: Any, run_id: str, kind: str, data: dict[str, Any]) -> None:
    cursor.execute(_EVENT.sql, _EVENT.args({"run_id": run_id, "kind": kind, "data": data}))


class SqliteDialect(Dialect):
    """SQLite: the portable claims, no notifications, the step writes on the cursor."""

    name: ClassVar[str] = "sqlite"
    # One writer at a time, and another process's writer waits in SQLite's busy handler
    # (sleeping up to 100 ms between tries): back-to-back batches would starve it.
    rest_after_batch: ClassVar[float] = 1.0
    # A read opens a deferred transaction (``connect.READ``), never the writers' lock.
    read_options: ClassVar[dict[str, Any]] = {READ: True}

    def insert_new(self, table: sa.Table) -> sa.Insert:
        return sqlite.insert(table).on_conflict_do_nothing()

    def read_run(self, conn: Connection, run_id: str, *, history: bool) -> Loaded | None:
        return read_portable(conn, run_id, history=history, texts=_texts)

    def write_turn(
        self,
        conn: Connection,
        params: dict[str, Any],
        *,
        final: bool,
        messages: list[dict[str, Any]],
        intents: list[dict[str, Any]],
        events: list[tuple[str, dict[str, Any]]],
    ) -> None:
        """The fenced counters, the turn's messages from ``b_seq``, its ledger entries (an
        intent, or an outcome when ``done``), its events."""
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        run_id, seq = params["b_id"], params["b_seq"]
        _fenced(cursor, _TURN[final], params)
        rows = [{"run_id": run_id, "seq": seq + i, "message": m} for i, m in enumerate(messages)]
        cursor.executemany(_MESSAGE.sql, [_MESSAGE.args(row) for row in rows])
        for intent in intents:
            insert = _DONE if intent["done"] else _INTENT
            cursor.execute(insert.sql, insert.args({**intent, "run_id": run_id, "seq": seq}))
        # One statement prepared once for the step's events (its turn, its reads' results).
        cursor.executemany(
            _EVENT.sql,
            [_EVENT.args({"run_id": run_id, "kind": k, "data": d}) for k, d in events],
        )

    def write_result(
        self,
        conn: Connection,
        params: dict[str, Any],
        *,
        message: dict[str, Any],
        event: dict[str, Any],
    ) -> None:
        """The fenced counters, the result message at ``b_seq``, its ledger outcome, and its
        event."""
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        run_id = params["b_id"]
        _fenced(cursor, _RESULT, params)
        row = {"run_id": run_id, "seq": params["b_seq"], "message": message}
        cursor.execute(_MESSAGE.sql, _MESSAGE.args(row))
        cursor.execute(_OUTCOME.sql, _OUTCOME.args(params))
        _event(cursor, run_id, "tool_result", event)
