"""What differs between SQLite and PostgreSQL, as one small object per backend.

The store writes its queries once; a backend overrides only these hooks (as DBOS's
system database subclasses do): how claim candidates are locked (``SKIP LOCKED`` or
nothing: SQLite serialises writers at ``BEGIN IMMEDIATE``), how idle workers are woken
(``pg_notify`` or nothing: they poll), the DSN a ``LISTEN`` connection uses, and the two
step writes, which PostgreSQL sends as one statement each (``pg_steps``) because there
every statement is a round trip, and SQLite sends to the driver's cursor directly
(``sqlite_steps``) because there the cost is the work around each statement.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine

from tether.errors import ConfigError, LeaseLost
from tether.store import pg_steps, sqlite_steps
from tether.store.announce import mark
from tether.store.listen import RUNS_CHANNEL
from tether.store.statements import RESULT, TURN, TURN_FINAL

_Query = TypeVar("_Query", bound=sa.Select[Any])

# PostgreSQL: each step write as one statement, by shape (final turn or not, traced or not).
_PG_TURN = {
    final: pg_steps.turn_statement(TURN_FINAL.statement if final else TURN)
    for final in (False, True)
}
_PG_RESULT = {traced: pg_steps.result_statement(RESULT, traced=traced) for traced in (False, True)}

_NOTIFY = sa.select(sa.func.pg_notify(RUNS_CHANNEL, ""))


def fenced(conn: Connection, stmt: Any, params: dict[str, Any]) -> int:
    """Run a lease-conditional UPDATE … RETURNING message_count; the new message's seq.
    No row means the lease was lost: ``LeaseLost``, and the caller's transaction rolls
    back."""
    row = conn.execute(stmt, params).first()
    if row is None:
        raise LeaseLost("this worker no longer owns the run", run_id=params["b_id"])
    mark(conn, params["b_id"])  # a step write's events (a result without one: harmless)
    return int(row[0]) - 1


class Dialect:
    """The portable behaviour: no row locks, no notifications. A backend overrides what it
    does differently, and gives its own step writes."""

    name: ClassVar[str]
    # Whether a ready run is announced (so workers may LISTEN instead of polling).
    notifies: ClassVar[bool] = False
    # Whether the claims of suspensions and orphans are sent as one statement each
    # (``pg_claims``, chosen by ``claims.py``) rather than as statement sequences.
    one_statement_claims: ClassVar[bool] = False

    def candidates(self, query: _Query) -> _Query:
        """Lock the rows a claim picks, so concurrent claimers pick different ones."""
        return query

    def lock(self, query: _Query) -> _Query:
        """Lock the row a read-then-CAS reads, until the transaction ends."""
        return query

    def wake(self, conn: Connection) -> None:
        """Tell idle workers a run became ready (sent at commit)."""

    def listen_dsn(self, url: URL) -> str | None:
        """The libpq DSN a ``LISTEN`` connection should use; None without notifications."""
        return None

    def insert_new(self, table: sa.Table) -> sa.Insert:
        """An INSERT that skips rows whose key exists (race-free "create if missing")."""
        raise NotImplementedError

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
        """The fenced counters (``LeaseLost`` when the lease or ``b_seq`` does not hold),
        the assistant message (and, for a read-only step, its calls' results after it)
        from ``b_seq``, the ledger entries, the events."""
        raise NotImplementedError

    def write_result(
        self,
        conn: Connection,
        params: dict[str, Any],
        *,
        traced: bool,
        message: dict[str, Any],
        event: dict[str, Any],
    ) -> None:
        """The fenced counters, the tool's result message at ``b_seq``, its ledger outcome
        (the ``b_key``/``b_status``/``b_result`` of ``params``) and, if ``traced``, an
        event."""
        raise NotImplementedError


class SqliteDialect(Dialect):
    """SQLite: writers serialise at ``BEGIN IMMEDIATE``, so claims need no row locks, and
    a statement is a function call, so a step write is a short statement sequence, sent
    to the driver's cursor directly (``sqlite_steps``)."""

    name: ClassVar[str] = "sqlite"

    def insert_new(self, table: sa.Table) -> sa.Insert:
        return sqlite.insert(table).on_conflict_do_nothing()

    # The step writes, on the driver's cursor.
    write_turn = staticmethod(sqlite_steps.write_turn)
    write_result = staticmethod(sqlite_steps.write_result)


class PostgresDialect(Dialect):
    """PostgreSQL: SKIP LOCKED claims, NOTIFY on a ready run, one statement per step."""

    name: ClassVar[str] = "postgresql"
    notifies: ClassVar[bool] = True
    one_statement_claims: ClassVar[bool] = True

    def candidates(self, query: _Query) -> _Query:
        return query.with_for_update(skip_locked=True)

    def lock(self, query: _Query) -> _Query:
        return query.with_for_update()

    def wake(self, conn: Connection) -> None:
        conn.execute(_NOTIFY)

    def listen_dsn(self, url: URL) -> str | None:
        return url.set(drivername="postgresql").render_as_string(hide_password=False)

    def insert_new(self, table: sa.Table) -> sa.Insert:
        return postgresql.insert(table).on_conflict_do_nothing()

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
        values = {
            **params,
            "b_messages": messages,
            "b_intents": intents,
            "b_events": [{"kind": kind, "data": data} for kind, data in events],
        }
        fenced(conn, _PG_TURN[final], values)

    def write_result(
        self,
        conn: Connection,
        params: dict[str, Any],
        *,
        traced: bool,
        message: dict[str, Any],
        event: dict[str, Any],
    ) -> None:
        fenced(conn, _PG_RESULT[traced], {**params, "b_message": message, "b_event": event})


def dialect_for(engine: Engine) -> Dialect:
    """The dialect object of ``engine``'s backend."""
    for dialect in (SqliteDialect(), PostgresDialect()):
        if engine.dialect.name == dialect.name:
            return dialect
    raise ConfigError(f"unsupported database backend {engine.dialect.name!r}")
