"""Typed output and trace context (reference §11).

``runs.output`` holds a run's validated typed output (the agent's ``output_type``), or NULL.
``runs.trace_context`` holds the W3C trace context of the run's root span, so a run resumed
in another process (after an approval, a crash, a continuation) continues the same trace.

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


def upgrade() -> None:
    op.add_column("runs", sa.Column("output", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("trace_context", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_context")
        batch.drop_column("output")
