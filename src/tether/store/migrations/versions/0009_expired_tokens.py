"""An index on the tokens of halted runs, so an expired token is still matched to its run.

A suspension that expires halts its run (``suspension_expired``) and keeps the hash of its
token. ``runs_halted_token`` lets a token lookup that found no suspended run and no
decision find that halted run in one indexed read, so the run's owner can be told the run
is halted and how to continue it (reference §4), while an unknown token never scans the
finished runs.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    where = sa.text("state = 'halted'")
    op.create_index(
        "runs_halted_token",
        "runs",
        ["pending_token_hash"],
        unique=False,
        postgresql_where=where,
        sqlite_where=where,
    )


def downgrade() -> None:
    op.drop_index("runs_halted_token", table_name="runs")
