"""PostgreSQL's claims as one statement each, as ``pg_steps`` does for the step writes.

Where every statement is a round trip, a claim that is an UPDATE, an INSERT of the
decision and an INSERT of the event holds the run's row lock for three round trips, and
every rival claim of that token waits behind them. Chained in data-modifying CTEs that
select from the conditional UPDATE's RETURNING, the claim is one statement: when the
UPDATE matches no row (the token was used, expired or superseded; the orphan was taken),
nothing at all is written. SQLite keeps the plain statement sequences (``claims.py``):
there a statement is a function call.

The statements are built once at import by ``claims.py`` from its own transitions, so
the conditions are written once for both backends.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from tether.reasons import FailReason
from tether.store.clock import db_now
from tether.store.schema import decisions, run_events

_EVENT_COLUMNS = ["run_id", "at", "kind", "data"]


def _text(name: str) -> Any:
    """A text parameter typed in the SQL, so ``json_build_object`` can take it."""
    return sa.cast(sa.bindparam(name, type_=sa.String), sa.Text)


def _event(cte: sa.CTE, name: str, kind: str, **data: Any) -> sa.CTE:
    """Insert one ``kind`` event per row of ``cte``, its data a JSON object of ``data``."""
    pairs = [part for key, value in data.items() for part in (sa.literal(key), value)]
    rows = sa.select(
        cte.c.id, db_now(), sa.literal(kind), sa.func.json_build_object(*pairs).cast(sa.JSON)
    )
    return run_events.insert().from_select(_EVENT_COLUMNS, rows).cte(name)


def orphans_statement(recover: sa.Update, exhaust: sa.Update) -> sa.Select[Any]:
    """Claim a batch of orphans at once: ``recover`` (the orphans still within their
    attempts, each with a new lease epoch) and ``exhaust`` (those past them, failed),
    both over the same locked candidates, with a ``recovering`` or ``failed`` event each.

    Returns the claimed runs' rows, each with ``exhausted``: the failed runs' ids (a
    single row with a NULL id when no run was claimed, so the failures are never lost).
    """
    r = recover.cte("r")
    x = exhaust.cte("x")
    recovering = _event(
        r, "er", "recovering", recovery_attempts=r.c.recovery_attempts, owner=_text("b_owner")
    )
    failed = _event(
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


def suspended_statement(claim: sa.Update) -> sa.Select[Any]:
    """Claim a suspension and record the decision (who, when, on which digest, why, with
    which edited arguments) and its ``approved`` / ``declined`` event, all from the claim's
    RETURNING: nothing is written when the claim lost.

    Returns the claimed run's row with the decision's columns (``d_*``), or no row."""
    r = claim.cte("r")
    call_id = r.c.pending["tool_call_id"].as_string()
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
                call_id,
                _text("b_decision"),
                _text("b_approver"),
                db_now(),
                sa.func.coalesce(_text("b_digest"), r.c.pending["digest"].as_string()),
                _text("b_reason"),
                sa.bindparam("b_arguments", type_=sa.JSON),
            ),
        )
        .returning(*decisions.c)
        .cte("d")
    )
    data = sa.cast(sa.bindparam("b_event", type_=sa.JSON), JSONB).op("||")(
        sa.func.jsonb_build_object("tool_call_id", call_id)
    )
    rows = sa.select(r.c.id, db_now(), _text("b_kind"), sa.cast(data, sa.JSON))
    event = run_events.insert().from_select(_EVENT_COLUMNS, rows).cte("e")
    recorded = [decided.c[c.name].label(f"d_{c.name}") for c in decisions.c]
    return sa.select(*r.c, *recorded).select_from(r.join(decided, sa.true())).add_cte(event)
