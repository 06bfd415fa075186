"""Agent versions, the worker registry, forks and dry runs (reference §12).

``runs.agent_version`` is the version of the agent a run was written for; workers claim,
recover and resume only the versions they serve. Existing runs get the agent version
their ``versions`` JSON recorded when they started (``NAME@VERSION``). ``workers`` holds
one row per (worker, version it serves) with the worker's heartbeat, so a run that waits
on a version no live worker serves can be found (it is *stranded*).
``runs.forked_from_run`` / ``runs.forked_from_step`` are a fork's lineage (indexed, so a
run's forks are one lookup) and ``runs.dry_run`` marks a run whose writes never execute.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_runs = sa.table(
    "runs",
    sa.column("id", sa.String()),
    sa.column("versions", sa.JSON()),
    sa.column("agent_version", sa.String()),
)


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("agent_version", sa.String(128), nullable=False, server_default="")
    )
    op.add_column("runs", sa.Column("forked_from_run", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("forked_from_step", sa.Integer(), nullable=True))
    op.add_column(
        "runs", sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    conn = op.get_bind()
    rows = conn.execute(sa.select(_runs.c.id, _runs.c.versions)).all()
    for run_id, versions in rows:
        agent = (versions or {}).get("agent") or ""
        conn.execute(
            _runs.update().where(_runs.c.id == run_id).values(agent_version=str(agent)[:128])
        )
    op.create_index("runs_forked_from", "runs", ["forked_from_run"])
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(128), primary_key=True),
        sa.Column("version", sa.String(128), primary_key=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
    )
    op.create_index("workers_version", "workers", ["version", "heartbeat_at"])


def downgrade() -> None:
    op.drop_index("workers_version", table_name="workers")
    op.drop_table("workers")
    op.drop_index("runs_forked_from", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("dry_run")
        batch.drop_column("forked_from_step")
        batch.drop_column("forked_from_run")
        batch.drop_column("agent_version")
