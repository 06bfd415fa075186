"""Delayed hand-back (``runs.ready_at``) and an index for counting runs by state.

A run released with a delay (a retry's backoff) is not claimable before ``ready_at`` (the
database's clock); the ready-runs partial index still serves the claim, which filters on
``ready_at`` while it walks that index. ``runs_state`` lets the metrics gauge count runs
by state from the index alone; it is partial on ``length(state) > 0`` (always true), a
predicate only the count states, so no ``state = …`` lookup prefers it over the partial
indexes of 0001 (SQLite's planner, without statistics, otherwise would).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("ready_at", sa.Float(), nullable=True))
    where = sa.text("length(state) > 0")
    op.create_index(
        "runs_state", "runs", ["state"], unique=False, postgresql_where=where, sqlite_where=where
    )


def downgrade() -> None:
    op.drop_index("runs_state", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("ready_at")
