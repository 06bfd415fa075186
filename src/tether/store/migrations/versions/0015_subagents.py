"""Trees of sub-agents (reference §18): a child run names the run and tool call that
started it (one child per pair), its tree's root and its depth; a run halted by a budget
names whose limits stopped it; a child's thread is not a conversation. The ``waiting``
state makes a thread busy, so the index of busy runs is rebuilt with it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_BUSY_BEFORE = "state IN ('queued', 'running', 'suspended')"
_BUSY = "state IN ('queued', 'running', 'suspended', 'waiting')"
_CHILDREN = "parent_run_id IS NOT NULL"


def _busy_index(where: str) -> None:
    clause = sa.text(where)
    op.create_index(
        "runs_thread_busy",
        "runs",
        ["thread_id", "thread_pos"],
        postgresql_where=clause,
        sqlite_where=clause,
    )


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("parent_run_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("parent_tool_call_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("root_run_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("depth", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("halted_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("child_order", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("threads") as batch:
        batch.add_column(
            sa.Column("conversation", sa.Boolean(), nullable=False, server_default=sa.true())
        )
    op.execute("UPDATE runs SET root_run_id = id WHERE root_run_id IS NULL")
    op.create_index(
        "runs_child",
        "runs",
        ["parent_run_id", "parent_tool_call_id"],
        unique=True,
        postgresql_where=sa.text(_CHILDREN),
        sqlite_where=sa.text(_CHILDREN),
    )
    op.create_index("runs_root", "runs", ["root_run_id"])
    op.drop_index("runs_thread_busy", table_name="runs")
    _busy_index(_BUSY)


def downgrade() -> None:
    op.drop_index("runs_thread_busy", table_name="runs")
    _busy_index(_BUSY_BEFORE)
    op.drop_index("runs_root", table_name="runs")
    op.drop_index("runs_child", table_name="runs")
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("conversation")
    with op.batch_alter_table("runs") as batch:
        for column in (
            "child_order",
            "halted_by",
            "depth",
            "root_run_id",
            "parent_tool_call_id",
            "parent_run_id",
        ):
            batch.drop_column(column)
