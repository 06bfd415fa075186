"""Server-side inbox sessions, each tied to the API key that opened it.

A signed cookie alone could not be revoked: after signing out, or after the user's key was
removed, the old cookie still worked until it expired. ``web_sessions`` holds one row per
signed-in browser (the SHA-256 of the cookie's session id, never the id itself); signing
out deletes the row, and removing or rotating a key deletes the sessions it opened.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("sid_hash", sa.String(64), primary_key=True),
        sa.Column(
            "key_hash",
            sa.String(64),
            sa.ForeignKey("api_keys.key_hash", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("web_sessions_key", "web_sessions", ["key_hash"])
    op.create_index("web_sessions_user", "web_sessions", ["user_id"])
    op.create_index("web_sessions_expiry", "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("web_sessions_expiry", table_name="web_sessions")
    op.drop_index("web_sessions_user", table_name="web_sessions")
    op.drop_index("web_sessions_key", table_name="web_sessions")
    op.drop_table("web_sessions")
