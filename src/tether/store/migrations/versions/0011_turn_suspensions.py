"""Several calls of one turn pending at once (reference §15).

A suspension now waits on every call of its turn that needs confirmation, each with its
own token: ``pending_calls`` holds one row per call (the token's hash, the call as the
human is asked to decide it, its place in the turn, the lease epoch the run suspended
at, when its notice was delivered), and ``runs.undecided`` counts the calls of the
current suspension without a decision, so the decision that takes the last one claims
the run in the same conditional UPDATE that records it. Every suspension that existed
before (a run suspended, or halted with its suspension's token kept) becomes a
suspension of one call. Token lookups go through ``pending_calls``' primary key, so the
two indexes on ``runs.pending_token_hash`` go; that column keeps the hash of ``pending``'s
token (the first call of the suspension).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_runs = sa.table(
    "runs",
    sa.column("id", sa.String),
    sa.column("state", sa.String),
    sa.column("pending", sa.JSON),
    sa.column("pending_token_hash", sa.String),
    sa.column("lease_epoch", sa.Integer),
    sa.column("notified_at", sa.Float),
    sa.column("undecided", sa.Integer),
)


def upgrade() -> None:
    pending_calls = op.create_table(
        "pending_calls",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("call", sa.JSON(), nullable=False),
        sa.Column("notified_at", sa.Float(), nullable=True),
    )
    assert pending_calls is not None
    op.create_index("pending_calls_run", "pending_calls", ["run_id", "epoch", "position"])
    op.add_column("runs", sa.Column("undecided", sa.Integer(), nullable=False, server_default="0"))
    conn = op.get_bind()
    held = conn.execute(
        sa.select(
            _runs.c.id,
            _runs.c.state,
            _runs.c.pending,
            _runs.c.pending_token_hash,
            _runs.c.lease_epoch,
            _runs.c.notified_at,
        ).where(
            _runs.c.state.in_(["suspended", "halted"]),
            _runs.c.pending_token_hash.is_not(None),
            _runs.c.pending.is_not(None),
        )
    ).all()
    rows = [
        {
            "token_hash": r.pending_token_hash,
            "run_id": r.id,
            "tool_call_id": r.pending["tool_call_id"],
            "position": 0,
            "epoch": r.lease_epoch,
            "call": r.pending,
            "notified_at": r.notified_at,
        }
        for r in held
    ]
    if rows:
        op.bulk_insert(pending_calls, rows)
    op.execute(_runs.update().where(_runs.c.state == "suspended").values(undecided=1))
    op.drop_index("runs_suspended_token", table_name="runs")
    op.drop_index("runs_halted_token", table_name="runs")


def downgrade() -> None:
    suspended = sa.text("state = 'suspended'")
    halted = sa.text("state = 'halted'")
    op.create_index(
        "runs_suspended_token",
        "runs",
        ["pending_token_hash"],
        unique=True,
        postgresql_where=suspended,
        sqlite_where=suspended,
    )
    op.create_index(
        "runs_halted_token",
        "runs",
        ["pending_token_hash"],
        postgresql_where=halted,
        sqlite_where=halted,
    )
    op.drop_column("runs", "undecided")
    op.drop_index("pending_calls_run", table_name="pending_calls")
    op.drop_table("pending_calls")
