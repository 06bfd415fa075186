"""Who decides (reference §19): a suspended call's suspension and escalation times and its
escalation token, the approvals a quorum counts, and the audit of decisions, which no
UPDATE may change.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_ALIASED = "alias_hash IS NOT NULL"
_TO_ESCALATE = "escalate_at IS NOT NULL AND escalated_at IS NULL"
_UNSENT = "escalated_at IS NOT NULL AND escalation_notified_at IS NULL"
_NEVER_CHANGED = "audit records are never changed"

_SQLITE_TRIGGER = f"""
CREATE TRIGGER audit_never_changed BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, '{_NEVER_CHANGED}'); END
"""
_PG_FUNCTION = f"""
CREATE FUNCTION audit_never_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION '{_NEVER_CHANGED}'; END $$
"""
_PG_TRIGGER = """
CREATE TRIGGER audit_never_changed BEFORE UPDATE ON audit
FOR EACH ROW EXECUTE FUNCTION audit_never_changed()
"""


def _partial(name: str, column: str, where: str, *, unique: bool = False) -> None:
    clause = sa.text(where)
    op.create_index(
        name,
        "pending_calls",
        [column],
        unique=unique,
        postgresql_where=clause,
        sqlite_where=clause,
    )


def upgrade() -> None:
    with op.batch_alter_table("pending_calls") as batch:
        batch.add_column(sa.Column("suspended_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("escalate_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("escalated_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("alias_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("escalation_notified_at", sa.Float(), nullable=True))
    _partial("pending_calls_alias", "alias_hash", _ALIASED, unique=True)
    _partial("pending_calls_escalation", "escalate_at", _TO_ESCALATE)
    _partial("pending_calls_escalation_unsent", "escalated_at", _UNSENT)
    op.create_table(
        "approvals",
        sa.Column(
            "token_hash",
            sa.String(64),
            sa.ForeignKey("pending_calls.token_hash", ondelete="CASCADE", onupdate="CASCADE"),
            primary_key=True,
        ),
        sa.Column("approver", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("approved_at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    op.create_table(
        "audit",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("root_run_id", sa.String(64), nullable=True),
        sa.Column("user_id", sa.String(128), nullable=True),
        sa.Column("by", sa.String(128), nullable=True),
        sa.Column("tool", sa.String(128), nullable=True),
        sa.Column("tool_call_id", sa.String(128), nullable=True),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("decision", sa.String(16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
    )
    op.create_index("audit_user", "audit", ["user_id", "seq"])
    op.create_index("audit_by", "audit", ["by", "seq"])
    op.create_index("audit_at", "audit", ["at"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        op.execute(_PG_TRIGGER)
    else:
        op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    op.execute(
        "DROP TRIGGER IF EXISTS audit_never_changed"
        + (" ON audit" if op.get_bind().dialect.name == "postgresql" else "")
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS audit_never_changed()")
    op.drop_index("audit_at", table_name="audit")
    op.drop_index("audit_by", table_name="audit")
    op.drop_index("audit_user", table_name="audit")
    op.drop_table("audit")
    op.drop_table("approvals")
    op.drop_index("pending_calls_escalation_unsent", table_name="pending_calls")
    op.drop_index("pending_calls_escalation", table_name="pending_calls")
    op.drop_index("pending_calls_alias", table_name="pending_calls")
    with op.batch_alter_table("pending_calls") as batch:
        for column in (
            "escalation_notified_at",
            "alias_hash",
            "escalated_at",
            "escalate_at",
            "suspended_at",
        ):
            batch.drop_column(column)
