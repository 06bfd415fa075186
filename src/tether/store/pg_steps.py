"""PostgreSQL's dialect hook for the two step writes: each is one statement.

On SQLite a statement is a function call, so the step writes are plain statement
sequences (``dialect.Dialect``). On PostgreSQL each statement is a round trip to the
server, so the fenced UPDATE of the run, the message, the ledger rows and the trace event
are chained in data-modifying CTEs: every INSERT and UPDATE selects *from the fenced
UPDATE's RETURNING*, so when the lease is lost (no row) nothing at all is written, and the
statement returns no row, which the caller turns into ``LeaseLost``. A transaction is then
BEGIN, one statement and COMMIT, the same round trips as one plain INSERT.

Built once at import, one statement per shape (final turn or not, event or not).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tether.store.clock import db_now
from tether.store.records import CallStatus
from tether.store.schema import run_events, run_messages, tool_calls


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


def _event(fenced: sa.CTE, kind: str) -> sa.CTE:
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


def turn_statement(fenced_update: sa.Update) -> sa.Select[Any]:
    """The assistant turn (and a read-only step's results), its counters, its ledger
    entries and its trace events."""
    fenced = fenced_update.cte("r")
    parts = [_messages(fenced), _intents(fenced), _events(fenced)]
    return sa.select(fenced.c.message_count).add_cte(*parts)


def result_statement(fenced_update: sa.Update, *, traced: bool) -> sa.Select[Any]:
    """A tool's result, its counters and its ledger outcome (and a trace event if
    ``traced``)."""
    fenced = fenced_update.cte("r")
    parts = [_message(fenced), _outcome(fenced)]
    if traced:
        parts.append(_event(fenced, "tool_result"))
    return sa.select(fenced.c.message_count).add_cte(*parts)
