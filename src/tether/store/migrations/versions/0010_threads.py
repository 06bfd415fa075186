"""Conversations (reference §14): threads, queued follow-ups, idempotent creation and
compaction.

Every run belongs to a thread (``runs.thread_id``, its place ``runs.thread_pos``); each run
that existed before becomes the only run of a thread of its own, with the run's id.
``threads`` holds one row per conversation. ``runs.request_key`` (unique per user, a
partial index) remembers a creation request's ``Idempotency-Key``, the digest of its body
and the state it answered, for as long as its run is kept, and
``compactions`` the summaries a model sees in place of the messages they cover (the
messages themselves are never rewritten). ``runs.base_count`` counts the messages a fork
of a follow-up copies from the conversation before the run it forks;
``runs.last_input_tokens`` the input tokens the run's latest model call reported (over
its agent's threshold, the conversation is compacted before the next call).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_BUSY = sa.text("state IN ('queued', 'running', 'suspended')")
_QUEUED = sa.text("state = 'queued'")


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("threads_user", "threads", ["user_id", "updated_at"])
    op.add_column("runs", sa.Column("thread_id", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("thread_pos", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("runs", sa.Column("base_count", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("last_input_tokens", sa.Integer(), nullable=True))
    op.execute(
        "INSERT INTO threads (id, user_id, runs, created_at, updated_at) "
        "SELECT id, user_id, 1, started_at, updated_at FROM runs"
    )
    op.execute("UPDATE runs SET thread_id = id, thread_pos = 1")
    op.create_index("runs_thread", "runs", ["thread_id", "thread_pos"])
    op.create_index(
        "runs_thread_busy",
        "runs",
        ["thread_id", "thread_pos"],
        postgresql_where=_BUSY,
        sqlite_where=_BUSY,
    )
    op.create_index(
        "runs_queued", "runs", ["updated_at"], postgresql_where=_QUEUED, sqlite_where=_QUEUED
    )
    op.add_column("runs", sa.Column("request_key", sa.String(255), nullable=True))
    op.add_column("runs", sa.Column("request_digest", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("request_state", sa.String(16), nullable=True))
    requested = sa.text("request_key IS NOT NULL")
    op.create_index(
        "runs_request_key",
        "runs",
        ["user_id", "request_key"],
        unique=True,
        postgresql_where=requested,
        sqlite_where=requested,
    )
    op.create_table(
        "compactions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("thread_id", sa.String(64), nullable=False),
        sa.Column(
            "run_id",
            sa.String(64),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("through_seq", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("summary_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("compactions_thread", "compactions", ["thread_id", "id"])
    op.create_index("compactions_run", "compactions", ["run_id"])


def downgrade() -> None:
    op.drop_index("compactions_run", table_name="compactions")
    op.drop_index("compactions_thread", table_name="compactions")
    op.drop_table("compactions")
    op.drop_index("runs_request_key", table_name="runs")
    op.drop_index("runs_queued", table_name="runs")
    op.drop_index("runs_thread_busy", table_name="runs")
    op.drop_index("runs_thread", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("last_input_tokens")
        batch.drop_column("request_state")
        batch.drop_column("request_digest")
        batch.drop_column("request_key")
        batch.drop_column("base_count")
        batch.drop_column("thread_pos")
        batch.drop_column("thread_id")
    op.drop_index("threads_user", table_name="threads")
    op.drop_table("threads")
