"""The tool names each registered worker has for each version it serves (reference §12).

``workers.tools`` is the JSON list of the tool names of the agent a worker runs, written
when it registers, so ``tether runs migrate`` checks a run's pending tool against the
workers that serve the target version, without loading that version's code. Rows written
before this migration have none (NULL: unknown) until their worker registers again.

Revision ID: 0007_worker_tools
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_worker_tools"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("tools", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("tools")
