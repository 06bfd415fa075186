"""Removed users, priority bounds and revoked keys (reference §6, §13).

``users`` gains ``removed_at`` (a removed user's row is kept, so the name is not taken
again until their data is erased) and ``max_priority`` (the highest priority the user may
ask; NULL: ``TETHER_MAX_PRIORITY``). ``revoked_keys`` holds the SHA-256 of every key
revoked by a rotation or a removal, so an agent's published key (the demo's) is never
inserted again once an operator revoked it. Existing users stay as they were: not removed,
bounded by the setting.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("removed_at", sa.Float(), nullable=True))
    op.add_column("users", sa.Column("max_priority", sa.Integer(), nullable=True))
    op.create_table(
        "revoked_keys",
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key_hash"),
    )


def downgrade() -> None:
    op.drop_table("revoked_keys")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("max_priority")
        batch.drop_column("removed_at")
