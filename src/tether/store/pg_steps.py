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

from tether.store.engine import db_now
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


def _intents(fenced: sa.CTE) -> sa.CTE:
    """The turn's ledger intents, from one JSON array (any number of calls, one shape)."""
    given = (
        sa.func.json_to_recordset(_json("b_intents"))
        .table_valued(
            sa.column("idempotency_key", sa.Text),
            sa.column("tool_call_id", sa.Text),
            sa.column("tool", sa.Text),
            sa.column("arguments", sa.JSON),
            sa.column("effect", sa.Text),
        )
        .render_derived(name="i", with_types=True)
    )
    rows = sa.select(
        given.c.idempotency_key,
        sa.bindparam("b_id", type_=sa.String),
        given.c.tool_call_id,
        fenced.c.message_count - 1,
        given.c.tool,
        given.c.arguments,
        given.c.effect,
        sa.literal(CallStatus.INTENT.value),
        db_now(),
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
        "intent_at",
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


def turn_statement(fenced_update: sa.Update, *, final: bool) -> sa.Select[Any]:
    """The assistant turn, its counters, its ledger intents and its trace event."""
    fenced = fenced_update.cte("r")
    parts = [
        _message(fenced),
        _intents(fenced),
        _event(fenced, "answered" if final else "model_turn"),
    ]
    return sa.select(fenced.c.message_count).add_cte(*parts)


def result_statement(fenced_update: sa.Update, *, traced: bool) -> sa.Select[Any]:
    """A tool's result, its counters and its ledger outcome (and a trace event if
    ``traced``)."""
    fenced = fenced_update.cte("r")
    parts = [_message(fenced), _outcome(fenced)]
    if traced:
        parts.append(_event(fenced, "tool_result"))
    return sa.select(fenced.c.message_count).add_cte(*parts)
