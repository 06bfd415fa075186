"""PostgreSQL's dialect: ``SKIP LOCKED`` claims, ``NOTIFY`` on a ready run, and each step
write and each claim of a suspension or of orphans as one statement.

On SQLite a statement is a function call, so the step writes and claims are plain
statement sequences (``sqlite.py``, ``dialect.Dialect``). On PostgreSQL each statement is
a round trip to the server, so they are chained in data-modifying CTEs:

- a step write: the fenced UPDATE of the run, the message, the ledger rows and the trace
  event, every INSERT and UPDATE selecting *from the fenced UPDATE's RETURNING*, so when
  the lease is lost (no row) nothing at all is written, and the statement returns no row,
  which becomes ``LeaseLost``. A transaction is then BEGIN, one statement and COMMIT, the
  same round trips as one plain INSERT.
- a claim: as a sequence, the UPDATE, the INSERT of the decision and the INSERT of the
  event would hold the run's row lock for three round trips, every rival claim of that
  token waiting behind them. As one statement selecting from the conditional UPDATE's
  RETURNING, when the UPDATE matches no row (the token was used, expired or superseded;
  the orphan was taken), nothing is written.

Built once, when a PostgreSQL store first picks its dialect (``dialect_for``), one
statement per shape (final turn or not, event or not), from the same statements and
transitions as the other backend (``sql/steps.py``, ``sql/claims.py``), so the
conditions are written once for both.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL, Connection, Engine

from tether.errors import LeaseLost
from tether.reasons import FailReason
from tether.runs import Run, RunState
from tether.store.backend.announce import mark
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect, Query
from tether.store.backend.listen import RUNS_CHANNEL
from tether.store.backend.settling import transaction_fate
from tether.store.records import CallStatus, Decision
from tether.store.sql.claims import (
    CLAIM_SUSPENDED,
    EXHAUSTED,
    ORPHANS,
    PAST,
    RECOVERED,
    RUNNING,
    STALE,
    WITHIN,
)
from tether.store.sql.schema import (
    decisions,
    pending_calls,
    run_events,
    run_messages,
    runs,
    tool_calls,
)
from tether.store.sql.sealed import (
    keyring_of,
    stored_json,
    stored_text,
)
from tether.store.sql.snapshots import Loaded, read_in_one
from tether.store.sql.steps import RESULT, TURN, TURN_FINAL
from tether.store.sql.transitions import Transition

# -- the step writes ---------------------------------------------------------------------------


def _json(name: str) -> Any:
    """A JSON bound parameter (psycopg's dialect casts it, so ``INSERT … SELECT`` types it)."""
    return sa.bindparam(name, type_=sa.JSON)


def _message(fenced: sa.CTE) -> sa.CTE:
    """Insert the step's message at the seq the fenced UPDATE handed out."""
    rows = sa.select(
        sa.bindparam("b_id", type_=sa.String),
        fenced.c.message_count - 1,
        _json("b_message"),
    )
    return run_messages.insert().from_select(["run_id", "seq", "message"], rows).cte("m")


def _step_event(fenced: sa.CTE, kind: str) -> sa.CTE:
    rows = sa.select(
        sa.bindparam("b_id", type_=sa.String), db_now(), sa.literal(kind), _json("b_event")
    ).select_from(fenced)
    return run_events.insert().from_select(["run_id", "at", "kind", "data"], rows).cte("e")


def _messages(fenced: sa.CTE) -> sa.CTE:
    """Insert the step's messages (one JSON array, in order) from the seq ``b_seq``."""
    given = (
        sa.func.json_array_elements(_json("b_messages"))
        .table_valued(sa.column("value", sa.JSON), with_ordinality="n")
        .render_derived(name="ms")
    )
    rows = sa.select(
        sa.bindparam("b_id", type_=sa.String),
        sa.bindparam("b_seq", type_=sa.Integer) + given.c.n - 1,
        given.c.value,
    ).select_from(fenced.join(given, sa.true()))
    return run_messages.insert().from_select(["run_id", "seq", "message"], rows).cte("m")


def _events(fenced: sa.CTE) -> sa.CTE:
    """The step's trace events, from one JSON array of ``{"kind", "data"}``."""
    given = (
        sa.func.json_to_recordset(_json("b_events"))
        .table_valued(sa.column("kind", sa.Text), sa.column("data", sa.JSON))
        .render_derived(name="ev", with_types=True)
    )
    rows = sa.select(
        sa.bindparam("b_id", type_=sa.String), db_now(), given.c.kind, given.c.data
    ).select_from(fenced.join(given, sa.true()))
    return run_events.insert().from_select(["run_id", "at", "kind", "data"], rows).cte("e")


def _intents(fenced: sa.CTE) -> sa.CTE:
    """The turn's ledger entries, from one JSON array (any number of calls, one shape):
    intents, or the outcomes of a read-only step's calls (``done``)."""
    given = (
        sa.func.json_to_recordset(_json("b_intents"))
        .table_valued(
            sa.column("idempotency_key", sa.Text),
            sa.column("tool_call_id", sa.Text),
            sa.column("tool", sa.Text),
            sa.column("arguments", sa.JSON),
            sa.column("effect", sa.Text),
            sa.column("status", sa.Text),
            sa.column("result", sa.JSON),
            sa.column("done", sa.Boolean),
        )
        .render_derived(name="i", with_types=True)
    )
    rows = sa.select(
        given.c.idempotency_key,
        sa.bindparam("b_id", type_=sa.String),
        given.c.tool_call_id,
        sa.bindparam("b_seq", type_=sa.Integer),
        given.c.tool,
        given.c.arguments,
        given.c.effect,
        given.c.status,
        given.c.result,
        db_now(),
        sa.case((given.c.done, db_now()), else_=sa.null()),
    ).select_from(fenced.join(given, sa.true()))
    columns = [
        "idempotency_key",
        "run_id",
        "tool_call_id",
        "seq",
        "tool",
        "arguments",
        "effect",
        "status",
        "result",
        "intent_at",
        "outcome_at",
    ]
    return tool_calls.insert().from_select(columns, rows).cte("l")


def _outcome(fenced: sa.CTE) -> sa.CTE:
    """Record the call's outcome in the ledger, only if the fenced UPDATE applied."""
    return (
        tool_calls.update()
        .where(
            tool_calls.c.idempotency_key == sa.bindparam("b_key"),
            tool_calls.c.status.in_([CallStatus.INTENT.value, CallStatus.UNKNOWN.value]),
            sa.select(fenced.c.message_count).exists(),
        )
        .values(
            status=sa.bindparam("b_status"),
            result=_json("b_result"),
            outcome_at=db_now(),
        )
        .cte("o")
    )


def _turn_statement(fenced_update: sa.Update) -> sa.Select[Any]:
    """The assistant turn (and a read-only step's results), its counters, its ledger
    entries and its trace events."""
    fenced = fenced_update.cte("r")
    parts = [_messages(fenced), _intents(fenced), _events(fenced)]
    return sa.select(fenced.c.message_count).add_cte(*parts)


def _result_statement(fenced_update: sa.Update) -> sa.Select[Any]:
    """A tool's result, its counters, its ledger outcome and its trace event."""
    fenced = fenced_update.cte("r")
    parts = [_message(fenced), _outcome(fenced), _step_event(fenced, "tool_result")]
    return sa.select(fenced.c.message_count).add_cte(*parts)


# -- the claims --------------------------------------------------------------------------------

_EVENT_COLUMNS = ["run_id", "at", "kind", "data"]


def _text(name: str) -> Any:
    """A text parameter typed in the SQL, so ``json_build_object`` can take it."""
    return sa.cast(sa.bindparam(name, type_=sa.String), sa.Text)


def _claim_event(cte: sa.CTE, name: str, kind: str, **data: Any) -> sa.CTE:
    """Insert one ``kind`` event per row of ``cte``, its data a JSON object of ``data``."""
    pairs = [part for key, value in data.items() for part in (sa.literal(key), value)]
    rows = sa.select(
        cte.c.id, db_now(), sa.literal(kind), sa.func.json_build_object(*pairs).cast(sa.JSON)
    )
    return run_events.insert().from_select(_EVENT_COLUMNS, rows).cte(name)


def _orphans_statement(recover: sa.Update, exhaust: sa.Update) -> sa.Select[Any]:
    """Claim a batch of orphans at once: ``recover`` (the orphans still within their
    attempts, each with a new lease epoch) and ``exhaust`` (those past them, failed),
    both over the same locked candidates, with a ``recovering`` or ``failed`` event each.

    Returns the claimed runs' rows, each with ``exhausted``: the failed runs' ids (a
    single row with a NULL id when no run was claimed, so the failures are never lost).
    """
    r = recover.cte("r")
    x = exhaust.cte("x")
    recovering = _claim_event(
        r, "er", "recovering", recovery_attempts=r.c.recovery_attempts, owner=_text("b_owner")
    )
    failed = _claim_event(
        x,
        "ex",
        "failed",
        reason=sa.literal(FailReason.RECOVERY_EXHAUSTED.value),
        recovery_attempts=x.c.recovery_attempts,
    )
    exhausted = sa.select(sa.func.array_agg(x.c.id)).scalar_subquery().label("exhausted")
    one = sa.select(sa.literal(1).label("one")).subquery("one")
    return (
        sa.select(*r.c, exhausted)
        .select_from(one.outerjoin(r, sa.true()))
        .add_cte(recovering, failed)
    )


def _suspension_statement(claim: sa.Update) -> sa.Select[Any]:
    """Claim a suspension and record the decision (who, when, on which digest, why, with
    which edited arguments) and its ``approved`` / ``declined`` event, all from the claim's
    RETURNING: nothing is written when the claim lost.

    Returns the claimed run's row with the decision's columns (``d_*``), or no row."""
    r = claim.cte("r")
    call = pending_calls.alias("p")
    of_token = call.c.token_hash == _text("b_token_hash")
    decided = (
        decisions.insert()
        .from_select(
            [
                "token_hash",
                "run_id",
                "tool_call_id",
                "decision",
                "decided_by",
                "decided_at",
                "digest",
                "reason",
                "arguments",
            ],
            sa.select(
                _text("b_token_hash"),
                r.c.id,
                call.c.tool_call_id,
                _text("b_decision"),
                _text("b_approver"),
                db_now(),
                sa.func.coalesce(_text("b_digest"), call.c.digest),
                _text("b_reason"),
                sa.bindparam("b_arguments", type_=sa.JSON),
            ).select_from(r.join(call, of_token)),
        )
        .returning(*decisions.c)
        .cte("d")
    )
    data = sa.cast(sa.bindparam("b_event", type_=sa.JSON), JSONB).op("||")(
        sa.func.jsonb_build_object("tool_call_id", decided.c.tool_call_id)
    )
    rows = sa.select(decided.c.run_id, db_now(), _text("b_kind"), sa.cast(data, sa.JSON))
    event = run_events.insert().from_select(_EVENT_COLUMNS, rows).cte("e")
    recorded = [decided.c[c.name].label(f"d_{c.name}") for c in decisions.c]
    return sa.select(*r.c, *recorded).select_from(r.join(decided, sa.true())).add_cte(event)


# -- the statements, by shape ------------------------------------------------------------------

_TURN = {final: _turn_statement(TURN_FINAL.statement if final else TURN) for final in (False, True)}
_RESULT = _result_statement(RESULT)
_CLAIM_SUSPENSION = _suspension_statement(CLAIM_SUSPENDED.statement)
# The two transitions of an orphan over a whole batch of locked candidates at once.
_LOCKED = ORPHANS.with_for_update(skip_locked=True).cte("c")
_IN_BATCH = runs.c.id == _LOCKED.c.id
_CLAIM_ORPHANS = _orphans_statement(
    Transition(RUNNING, RUNNING, _IN_BATCH, STALE, WITHIN, **RECOVERED).statement,
    Transition(RUNNING, RunState.FAILED, _IN_BATCH, STALE, PAST, **EXHAUSTED).statement,
)
_NOTIFY = sa.select(sa.func.pg_notify(RUNS_CHANNEL, ""))


def _fenced(conn: Connection, stmt: Any, params: dict[str, Any]) -> int:
    """Run a lease-conditional UPDATE … RETURNING message_count; the new message's seq.
    No row means the lease was lost: ``LeaseLost``, and the caller's transaction rolls
    back."""
    row = conn.execute(stmt, params).first()
    if row is None:
        raise LeaseLost("this worker no longer owns the run", run_id=params["b_id"])
    mark(conn, params["b_id"])  # a step write's events (a result without one: harmless)
    return int(row[0]) - 1


class PostgresDialect(Dialect):
    """PostgreSQL: SKIP LOCKED claims, NOTIFY on a ready run, one statement per step write
    and per claim."""

    name: ClassVar[str] = "postgresql"
    notifies: ClassVar[bool] = True
    locks_rows: ClassVar[bool] = True

    laterals: ClassVar[bool] = True
    skips_locked: ClassVar[bool] = True

    def candidates(self, query: Query, of: Any = None) -> Query:
        return query.with_for_update(skip_locked=True, of=of)

    def lock(self, query: Query) -> Query:
        return query.with_for_update()

    def share(self, query: Query) -> Query:
        return query.with_for_update(read=True)

    def among(self, column: sa.ColumnElement[Any], ids: sa.Select[Any]) -> sa.ColumnElement[bool]:
        # ``= ANY(ARRAY(pick))``: the pick runs once, and the rows are found by the primary
        # key (as the inner side of an ``IN``'s semi-join the pick was scanned again for
        # every waiting run).
        return column == sa.any_(sa.func.array(ids.scalar_subquery()))

    def wake(self, conn: Connection) -> None:
        conn.execute(_NOTIFY)

    xid: ClassVar[sa.ColumnElement[Any] | None] = sa.func.txid_current().label("xid")

    def fate(self, engine: Engine, xid: int) -> str | None:
        return transaction_fate(engine, xid)

    def read_run(self, conn: Connection, run_id: str, *, history: bool) -> Loaded | None:
        return read_in_one(conn, run_id, history=history)

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
        _fenced(conn, _TURN[final], values)

    def write_result(
        self,
        conn: Connection,
        params: dict[str, Any],
        *,
        message: dict[str, Any],
        event: dict[str, Any],
    ) -> None:
        _fenced(conn, _RESULT, {**params, "b_message": message, "b_event": event})

    def claim_suspension(
        self, conn: Connection, params: dict[str, Any]
    ) -> tuple[Run, Decision] | None:
        keyring = keyring_of(conn.dialect)
        if keyring is not None:
            # The one statement merges the event's data in SQL, which sealed data is not:
            # the portable UPDATE and INSERTs seal through the columns' types.
            return super().claim_suspension(conn, params)
        params = {
            **params,
            "b_reason": stored_text(None, params["b_reason"]),
            "b_arguments": stored_json(None, params["b_arguments"]),
        }
        won = conn.execute(_CLAIM_SUSPENSION, params).first()
        if won is None:
            return None
        mark(conn, won.id)  # its approved / declined event
        mapping = won._mapping
        recorded = {c.name: mapping[f"d_{c.name}"] for c in decisions.c}
        return Run.from_row(mapping), Decision.from_row(recorded)

    def claim_orphans(
        self, conn: Connection, params: dict[str, Any]
    ) -> tuple[list[Run], list[str]]:
        rows = conn.execute(_CLAIM_ORPHANS, params).all()
        claimed = [Run.from_row(r._mapping) for r in rows if r.id is not None]
        exhausted = list(rows[0].exhausted or []) if rows else []
        mark(conn, *(run.id for run in claimed), *exhausted)  # recovering / failed
        return claimed, exhausted
