"""What differs between SQLite and PostgreSQL, as one object per backend.

The store writes its queries once and calls its dialect (``store.dialect``) where the
backends differ; a backend overrides only these hooks (as DBOS's system database
subclasses do):

- ``candidates`` / ``lock`` / ``share``: how claim candidates, read-then-CAS rows and
  rows read against a writer are locked (``SKIP LOCKED`` / ``FOR UPDATE`` / ``FOR SHARE``,
  or nothing: SQLite serialises writers at ``BEGIN IMMEDIATE``), and ``among``: how an
  UPDATE names the rows a pick chose;
- ``wake``: how idle workers are told a run became ready (``pg_notify`` on
  ``listen.RUNS_CHANNEL``, or nothing: they poll), and ``listen_dsn``, the DSN of a
  connection that listens or sends notices;
- ``insert_new``: an INSERT that skips existing keys;
- ``read_run``: a run's state to carry it on, in one statement where a statement is a
  round trip (``snapshots``);
- ``write_turn`` / ``write_result``: the two step writes;
- ``claim_suspension`` / ``claim_orphans``: the claims of a suspension (with its decision)
  and of a batch of orphans.

``Dialect`` is the portable behaviour: no locks, no notifications, the claims as
statement sequences. ``sqlite.SqliteDialect`` sends its step writes to the driver's
cursor (there the cost is the work around each statement); ``postgres.PostgresDialect``
sends each step write and each claim as one statement (there every statement is a round
trip). ``dialect_for`` picks one by backend name and imports only that module, so a
SQLite store never builds PostgreSQL's statements nor loads its driver.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from tether.errors import ConfigError
from tether.reasons import FailReason
from tether.runs import Run
from tether.store.backend.clock import db_now
from tether.store.records import Decision
from tether.store.sql.claims import (
    CALL_OF_TOKEN,
    CLAIM_SUSPENDED,
    EXHAUST,
    ORPHANS,
    RECOVER,
)
from tether.store.sql.schema import decisions
from tether.store.sql.snapshots import Loaded, read_portable
from tether.store.sql.steps import add_event

# A SELECT a lock hook returns as it came, with its locking clause.
Query = TypeVar("Query", bound=sa.Select[Any])


class Dialect:
    """The portable behaviour: no row locks, no notifications, each claim a sequence of
    statements. A backend overrides what it does differently, and gives its own step
    writes and ``insert_new``."""

    name: ClassVar[str]
    # Whether a ready run is announced (so workers may LISTEN instead of polling).
    notifies: ClassVar[bool] = False

    # Whether the claim may read each user's best run with a LATERAL join (``claim_order``).
    laterals: ClassVar[bool] = False

    # Whether concurrent claimers skip the candidates another holds (so a claim ranks spare
    # ones: ``fair_pick.pick_sizes``); here claims are serialised.
    skips_locked: ClassVar[bool] = False

    # How long a bulk job (an erasure) rests after each batch, as a share of the batch's
    # time, so that other processes' writers get in (0: row locks already let them).
    rest_after_batch: ClassVar[float] = 0.0

    # Whether rows are locked one by one (``lock``); when not, every write transaction holds
    # the database's one write lock from its start (SQLite's ``BEGIN IMMEDIATE``).
    locks_rows: ClassVar[bool] = False

    # The execution options of a connection that only reads (``StoreBase.reading``).
    read_options: ClassVar[dict[str, Any]] = {"isolation_level": "AUTOCOMMIT"}

    def candidates(self, query: Query, of: Any = None) -> Query:
        """Lock the rows a claim picks (of the tables ``of``, default all it reads), so
        concurrent claimers pick different ones."""
        return query

    def lock(self, query: Query) -> Query:
        """Lock the row a read-then-CAS reads, until the transaction ends."""
        return query

    def share(self, query: Query) -> Query:
        """Lock the row read against writers but not other sharers, until the transaction
        ends (a user's row while a run of theirs is created: ``users.admit``)."""
        return query

    def among(self, column: sa.ColumnElement[Any], ids: sa.Select[Any]) -> sa.ColumnElement[bool]:
        """``column`` is one of the values ``ids`` selects (an UPDATE of the rows a pick
        chose): here ``IN``."""
        return column.in_(ids)

    def wake(self, conn: Connection) -> None:
        """Tell idle workers a run became ready (sent at commit)."""

    # The column a write returns to name its transaction (``fate``); None: none.
    xid: ClassVar[sa.ColumnElement[Any] | None] = None

    def fate(self, engine: Engine, xid: int) -> str | None:
        """Whether the transaction ``xid``, whose COMMIT was cut off, ``committed`` or was
        ``aborted``; None when that cannot be told (here: never)."""
        return None

    def read_run(self, conn: Connection, run_id: str, *, history: bool) -> Loaded | None:
        """A run's state to carry it on (``snapshots``): here plain statements, in the
        caller's read transaction."""
        return read_portable(conn, run_id, history=history)

    def listen_dsn(self, url: URL) -> str | None:
        """The libpq DSN of ``url`` for a connection that listens to notices or sends
        them; None without notifications."""
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
        message: dict[str, Any],
        event: dict[str, Any],
    ) -> None:
        """The fenced counters, the tool's result message at ``b_seq``, its ledger outcome
        (the ``b_key``/``b_status``/``b_result`` of ``params``) and its ``tool_result``
        event."""
        raise NotImplementedError

    def claim_suspension(
        self, conn: Connection, params: dict[str, Any]
    ) -> tuple[Run, Decision] | None:
        """Record the decision of ``params`` on its call (``CLAIM_SUSPENDED``: the last
        one of the suspension claims the run) with its ``approved`` / ``declined`` event
        (``b_kind``, data ``b_event``); the run as the UPDATE left it (``running`` when
        this decision claimed it, ``suspended`` when others are undecided) and the
        decision recorded, or None when nothing was written. Here: the UPDATE, then the
        two INSERTs."""
        row = CLAIM_SUSPENDED.one(conn, params)
        if row is None:
            return None
        run = Run.from_row(row._mapping)
        call = conn.execute(CALL_OF_TOKEN, params).one()
        recorded = conn.execute(
            decisions.insert()
            .values(
                token_hash=params["b_token_hash"],
                run_id=run.id,
                tool_call_id=call.tool_call_id,
                decision=params["b_decision"],
                decided_by=params["b_approver"],
                decided_at=db_now(),
                digest=params["b_digest"] or call.call.get("digest"),
                reason=params["b_reason"],
                arguments=params["b_arguments"],
            )
            .returning(*decisions.c)
        ).one()
        data = {**params["b_event"], "tool_call_id": call.tool_call_id}
        add_event(conn, run.id, params["b_kind"], data)
        return run, Decision.from_row(recorded._mapping)

    def claim_orphans(
        self, conn: Connection, params: dict[str, Any]
    ) -> tuple[list[Run], list[str]]:
        """Claim the orphans of ``params`` (``ORPHANS``, locked by ``candidates``): each
        within its attempts recovered (``RECOVER``, a ``recovering`` event), each past
        them failed (``EXHAUST``, a ``failed`` event). The runs claimed and the ids of
        those failed. Here: one run at a time."""
        claimed: list[Run] = []
        exhausted: list[str] = []
        for run_id in conn.execute(self.candidates(ORPHANS), params).scalars().all():
            row = RECOVER.one(conn, {**params, "b_id": run_id})
            if row is not None:
                run = Run.from_row(row._mapping)
                claimed.append(run)
                data = {"recovery_attempts": run.recovery_attempts, "owner": params["b_owner"]}
                add_event(conn, run_id, "recovering", data)
                continue
            failed = EXHAUST.one(conn, {**params, "b_id": run_id})
            if failed is not None:
                exhausted.append(run_id)
                data = {
                    "reason": FailReason.RECOVERY_EXHAUSTED.value,
                    "recovery_attempts": failed.recovery_attempts,
                }
                add_event(conn, run_id, "failed", data)
        return claimed, exhausted


def dialect_for(backend: str) -> Dialect:
    """The dialect of the backend SQLAlchemy names ``backend`` (``engine.dialect.name``).
    Only that backend's module is imported."""
    if backend == "sqlite":
        from tether.store.backend.sqlite import SqliteDialect

        return SqliteDialect()
    if backend == "postgresql":
        from tether.store.backend.postgres import PostgresDialect

        return PostgresDialect()
    raise ConfigError(f"unsupported database backend {backend!r}")
