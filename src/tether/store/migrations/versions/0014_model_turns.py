"""The model's capacity shared out by user (reference §13): ``model_usage`` rows name the
user whose requests and tokens they count, and ``model_waits`` lists, fleet-wide, the
users whose runs wait for capacity in each limiter, so a lease in any process gives the
capacity that frees to the waiting user who used least of the window first.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_usage") as batch:
        batch.add_column(sa.Column("user_id", sa.String(128), nullable=True))
    op.create_table(
        "model_waits",
        sa.Column("waiter", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(128), primary_key=True),
        sa.Column("wanting", sa.Integer(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("model_waits")
    with op.batch_alter_table("model_usage") as batch:
        batch.drop_column("user_id")
