"""People's data (reference §20): retention per user, the keys that sealed stored content,
a pending call's tool and digest in the clear, and an audit that only erasure or sealing
may change.

``users`` gains ``retention_days`` (NULL: ``TETHER_RETENTION_DAYS``). ``sealing_keys``
lists the id of every key that has sealed a value still stored, so a process without one
of them refuses to start. ``pending_calls`` gains ``tool`` and ``digest`` (copied from its
``call``), because the call itself may be sealed and SQL must still read them. The audit's
trigger now lets through exactly two changes: an erasure (``user_id`` / ``by`` replaced by
the name's digest, every field but ``seq``, ``at``, ``kind`` and ``outcome`` nulled) and
the sealing of a record's ``reason``; every other UPDATE is still refused. A stored value
that happens to begin with the sealing mark is escaped, so it is never read as sealed.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# Kept in step with tether.sealing (a migration never imports the code it migrates for).
_MARK = "tether:sealed:"
_SEALED = _MARK + "1:"
_ESCAPED = _MARK + "0:"
_DIGEST = "sha256:"
_NEVER_CHANGED = "audit records are never changed"

_TEXTS = (
    ("runs", "question"),
    ("compactions", "summary"),
    ("decisions", "reason"),
    ("approvals", "reason"),
    ("audit", "reason"),
    ("schedules", "question"),
)
_JSONS = (
    ("runs", "pending"),
    ("runs", "output"),
    ("run_messages", "message"),
    ("run_events", "data"),
    ("tool_calls", "arguments"),
    ("tool_calls", "result"),
    ("tool_calls", "edited_arguments"),
    ("pending_calls", "call"),
    ("decisions", "arguments"),
)
_ERASABLE = ("run_id", "root_run_id", "tool", "tool_call_id", "digest", "decision")


def _allowed(same: str, differs: str, false: str) -> str:
    """The condition an UPDATE of an audit record must meet, in the backend's words for
    "is the same as" (NULLs equal), "differs from" and false."""

    def digested(column: str) -> str:
        return f"COALESCE(NEW.{column} LIKE '{_DIGEST}%', {false})"

    # ``by`` is a keyword: quoted wherever it is named.
    erasing = f'(NEW.user_id {differs} OLD.user_id OR NEW."by" {differs} OLD."by")'
    kept = " AND ".join(f"NEW.{c} {same} OLD.{c}" for c in ("seq", "at", "kind", "outcome"))
    named = " AND ".join(f"(NEW.{c} {same} OLD.{c} OR {digested(c)})" for c in ("user_id", '"by"'))
    nulled = " AND ".join(
        f"(NEW.{c} {same} OLD.{c} OR ({erasing} AND NEW.{c} IS NULL))" for c in _ERASABLE
    )
    reason = (
        f"(NEW.reason {same} OLD.reason OR ({erasing} AND NEW.reason IS NULL)"
        f" OR COALESCE(NEW.reason LIKE '{_SEALED}%', {false}))"
    )
    return f"{kept} AND {named} AND {nulled} AND {reason}"


_SQLITE_TRIGGER = f"""
CREATE TRIGGER audit_never_changed BEFORE UPDATE ON audit
WHEN NOT ({_allowed("IS", "IS NOT", "0")})
BEGIN SELECT RAISE(ABORT, '{_NEVER_CHANGED}'); END
"""
_PG_FUNCTION = f"""
CREATE OR REPLACE FUNCTION audit_never_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NOT ({_allowed("IS NOT DISTINCT FROM", "IS DISTINCT FROM", "false")}) THEN
    RAISE EXCEPTION '{_NEVER_CHANGED}';
  END IF;
  RETURN NEW;
END $$
"""
_PG_OLD_FUNCTION = f"""
CREATE OR REPLACE FUNCTION audit_never_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION '{_NEVER_CHANGED}'; END $$
"""
_SQLITE_OLD_TRIGGER = f"""
CREATE TRIGGER audit_never_changed BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, '{_NEVER_CHANGED}'); END
"""


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _escape_marked() -> None:
    """Escape every stored value that begins with the mark, so none is read as sealed."""
    for table, column in _TEXTS:
        op.execute(
            f"UPDATE {table} SET {column} = '{_ESCAPED}' || {column} WHERE {column} LIKE '{_MARK}%'"
        )
    for table, column in _JSONS:
        if _postgres():
            op.execute(
                f"UPDATE {table} SET {column} = to_json('{_ESCAPED}' || {column}::text) "
                f"WHERE {column}::text LIKE '\"{_MARK}%'"
            )
        else:
            op.execute(
                f"UPDATE {table} SET {column} = json_quote('{_ESCAPED}' || {column}) "
                f"WHERE {column} LIKE '\"{_MARK}%'"
            )


def upgrade() -> None:
    op.add_column("users", sa.Column("retention_days", sa.Float(), nullable=True))
    op.create_table(
        "sealing_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("since", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("pending_calls") as batch:
        batch.add_column(sa.Column("tool", sa.String(128), nullable=True))
        batch.add_column(sa.Column("digest", sa.String(64), nullable=True))
    if _postgres():
        op.execute("UPDATE pending_calls SET tool = call->>'tool', digest = call->>'digest'")
        op.execute("DROP TRIGGER IF EXISTS audit_never_changed ON audit")
    else:
        op.execute(
            "UPDATE pending_calls SET tool = json_extract(call, '$.tool'), "
            "digest = json_extract(call, '$.digest')"
        )
        op.execute("DROP TRIGGER IF EXISTS audit_never_changed")
    _escape_marked()
    if _postgres():
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER audit_never_changed BEFORE UPDATE ON audit "
            "FOR EACH ROW EXECUTE FUNCTION audit_never_changed()"
        )
    else:
        op.execute(_SQLITE_TRIGGER)


def downgrade() -> None:
    if _postgres():
        op.execute(_PG_OLD_FUNCTION)
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_never_changed")
        op.execute(_SQLITE_OLD_TRIGGER)
    with op.batch_alter_table("pending_calls") as batch:
        batch.drop_column("digest")
        batch.drop_column("tool")
    op.drop_table("sealing_keys")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("retention_days")
