"""The initial schema: runs, messages, events, the tool-call ledger and decisions.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _where(clause: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(clause), "sqlite_where": sa.text(clause)}


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("route", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_steps", sa.Integer(), nullable=False),
        sa.Column("max_spend_usd", sa.Float(), nullable=False),
        sa.Column("max_tool_calls", sa.Integer(), nullable=False),
        sa.Column("max_elapsed_ms", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Integer(), server_default="0", nullable=False),
        sa.Column("spend_usd", sa.Float(), server_default="0", nullable=False),
        sa.Column("tool_calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("elapsed_ms", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("scope_snapshot", sa.JSON(), nullable=False),
        sa.Column("scope_resolved_at", sa.Float(), nullable=False),
        sa.Column("pending", sa.JSON(), nullable=True),
        sa.Column("pending_token_hash", sa.String(length=64), nullable=True),
        sa.Column("suspended_at", sa.Float(), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("notified_at", sa.Float(), nullable=True),
        sa.Column("halt_reason", sa.String(length=32), nullable=True),
        sa.Column("fail_reason", sa.String(length=32), nullable=True),
        sa.Column("recovery_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("lease_epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=True),
        sa.Column("versions", sa.JSON(), nullable=False),
        sa.Column("message_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "runs_orphan_scan",
        "runs",
        ["heartbeat_at"],
        unique=False,
        **_where("state = 'running' AND owner IS NOT NULL"),
    )
    op.create_index(
        "runs_ready",
        "runs",
        ["updated_at"],
        unique=False,
        **_where("state = 'running' AND owner IS NULL"),
    )
    op.create_index(
        "runs_retention",
        "runs",
        ["updated_at"],
        unique=False,
        **_where("state IN ('halted', 'answered', 'failed', 'cancelled')"),
    )
    op.create_index(
        "runs_suspended_expiry",
        "runs",
        ["expires_at"],
        unique=False,
        **_where("state = 'suspended'"),
    )
    op.create_index(
        "runs_suspended_token",
        "runs",
        ["pending_token_hash"],
        unique=True,
        **_where("state = 'suspended'"),
    )
    op.create_index(
        "runs_unnotified",
        "runs",
        ["suspended_at"],
        unique=False,
        **_where("state = 'suspended' AND notified_at IS NULL"),
    )
    op.create_index("runs_user", "runs", ["user_id", "started_at"], unique=False)
    op.create_table(
        "decisions",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("tool_call_id", sa.String(length=128), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("decided_by", sa.String(length=128), nullable=False),
        sa.Column("decided_at", sa.Float(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("token_hash"),
    )
    op.create_index("decisions_run", "decisions", ["run_id", "tool_call_id"], unique=False)
    op.create_table(
        "run_events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("run_events_run", "run_events", ["run_id", "id"], unique=False)
    op.create_table(
        "run_messages",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("message", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "seq"),
    )
    op.create_table(
        "tool_calls",
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("tool_call_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("arguments", sa.JSON(), nullable=False),
        sa.Column("effect", sa.String(length=8), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("intent_at", sa.Float(), nullable=False),
        sa.Column("outcome_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("idempotency_key"),
    )
    op.create_index("tool_calls_run", "tool_calls", ["run_id", "seq"], unique=False)


def downgrade() -> None:
    op.drop_table("tool_calls")
    op.drop_table("run_messages")
    op.drop_index("run_events_run", table_name="run_events")
    op.drop_table("run_events")
    op.drop_index("decisions_run", table_name="decisions")
    op.drop_table("decisions")
    for name in (
        "runs_user",
        "runs_unnotified",
        "runs_suspended_token",
        "runs_suspended_expiry",
        "runs_retention",
        "runs_ready",
        "runs_orphan_scan",
    ):
        op.drop_index(name, table_name="runs")
    op.drop_table("runs")
