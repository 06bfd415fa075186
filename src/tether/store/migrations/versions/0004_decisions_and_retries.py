"""Richer decisions and model retries (reference §9, §10).

``decisions.reason`` and ``decisions.arguments`` keep a decision's reason and the
arguments an approver edited, so every later ``already_resumed`` answer carries them.
``tool_calls.edited_arguments`` records, beside the model's arguments, the arguments a
call actually ran with when a human edited them. ``runs.model_failures`` counts the
consecutive failed model calls of a run (a successful call resets it), judged against
``TETHER_MAX_MODEL_ATTEMPTS``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("reason", sa.Text(), nullable=True))
    op.add_column("decisions", sa.Column("arguments", sa.JSON(), nullable=True))
    op.add_column("tool_calls", sa.Column("edited_arguments", sa.JSON(), nullable=True))
    op.add_column(
        "runs",
        sa.Column("model_failures", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("model_failures")
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("edited_arguments")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("arguments")
        batch.drop_column("reason")
