"""Typed output, trace context, and notices of new events (SPEC §11).

``runs.output`` holds a run's validated typed output (the agent's ``output_type``), or NULL.
``runs.trace_context`` holds the W3C trace context of the run's root span, so a run resumed
in another process (after an approval, a crash, a continuation) continues the same trace.

On PostgreSQL, a statement-level trigger on ``run_events`` sends one ``NOTIFY tether_events``
per run that a statement gave events, with the run's id as the payload: every writer of
events (steps, claims, cancels, the reaper) wakes the live event streams through this one
mechanism, and PostgreSQL delivers the notices only when the transaction commits. On SQLite
the streams poll.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION tether_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tether_events', run_id) FROM (SELECT DISTINCT run_id FROM added) AS r;
    RETURN NULL;
END
$$
"""
_TRIGGER = """
CREATE TRIGGER run_events_notify AFTER INSERT ON run_events
REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION tether_events_notify()
"""


def upgrade() -> None:
    op.add_column("runs", sa.Column("output", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("trace_context", sa.JSON(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)
        op.execute(_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS run_events_notify ON run_events")
        op.execute("DROP FUNCTION IF EXISTS tether_events_notify()")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_context")
        batch.drop_column("output")
