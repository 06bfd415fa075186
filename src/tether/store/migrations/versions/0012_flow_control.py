"""Flow control for a fleet (reference §13): priorities, delayed starts, a per-user cap,
the model's rate limit shared by every worker, and schedules.

``runs`` gains ``priority`` (the claim takes the highest first, then the oldest: the
ready and queued indexes are rebuilt in that order, and ``runs_ready_user`` serves the
claim past users at their cap), ``start_at`` (a run stays ``queued`` until the
database's clock passes it) and ``schedule_id``. ``user_load`` counts each user's carried
runs (running under an owner); triggers on ``runs`` keep it on every change of a run's
state or owner, and the rows of runs that exist are counted once here. ``model_usage``
and ``gates`` hold the fleet's model requests and tokens of the last minute and the row a
lease of them locks; ``schedules`` the cron schedules with their next tick.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_READY = sa.text("state = 'running' AND owner IS NULL")
_QUEUED = sa.text("state = 'queued'")
_WAITS_THREAD = sa.text("state = 'queued' AND start_at IS NULL")
_WAITS_START = sa.text("state = 'queued' AND start_at IS NOT NULL")
_ORDER: list[str | sa.TextClause] = [sa.text("priority DESC"), "updated_at"]

# A run is carried while it is running under an owner, and ready while it is running with
# none (a worker may claim it); the triggers add what a change of ``runs`` does to both
# counts, per user. The INSERT trigger always writes the user's row, so a claim finds a
# row to lock for every user with a run.
_CARRIED = "({row}.state = 'running' AND {row}.owner IS NOT NULL)"
_READY_ROW = "({row}.state = 'running' AND {row}.owner IS NULL)"


def _flag(test: str, row: str) -> str:
    return f"CASE WHEN {test.format(row=row)} THEN 1 ELSE 0 END"


def _delta(test: str) -> str:
    """How a row's change moves the count of rows ``test`` holds of (NEW minus OLD)."""
    return f"({_flag(test, 'NEW')} - {_flag(test, 'OLD')})"


_CHANGED = (
    f"{_CARRIED.format(row='OLD')} IS DISTINCT FROM {_CARRIED.format(row='NEW')} OR "
    f"{_READY_ROW.format(row='OLD')} IS DISTINCT FROM {_READY_ROW.format(row='NEW')}"
)
_ADD = (
    "INSERT INTO user_load (user_id, carried, ready) VALUES ({who}, {carried}, {ready}) "
    "ON CONFLICT (user_id) DO UPDATE SET carried = user_load.carried + excluded.carried, "
    "ready = user_load.ready + excluded.ready;"
)
_INSERTED = _ADD.format(
    who="NEW.user_id", carried=_flag(_CARRIED, "NEW"), ready=_flag(_READY_ROW, "NEW")
)
_UPDATED = _ADD.format(who="NEW.user_id", carried=_delta(_CARRIED), ready=_delta(_READY_ROW))
_DELETED = _ADD.format(
    who="OLD.user_id", carried=f"-{_flag(_CARRIED, 'OLD')}", ready=f"-{_flag(_READY_ROW, 'OLD')}"
)
_COUNTED = f"{_CARRIED.format(row='OLD')} OR {_READY_ROW.format(row='OLD')}"

_PG = [
    f"""
    CREATE FUNCTION tether_user_load() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN {_INSERTED}
      ELSIF TG_OP = 'UPDATE' THEN {_UPDATED}
      ELSE {_DELETED}
      END IF;
      RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER runs_user_load_insert AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION tether_user_load()
    """,
    f"""
    CREATE TRIGGER runs_user_load_update AFTER UPDATE OF state, owner ON runs
    FOR EACH ROW WHEN ({_CHANGED}) EXECUTE FUNCTION tether_user_load()
    """,
    f"""
    CREATE TRIGGER runs_user_load_delete AFTER DELETE ON runs
    FOR EACH ROW WHEN ({_COUNTED}) EXECUTE FUNCTION tether_user_load()
    """,
]
_SQLITE = [
    f"CREATE TRIGGER runs_user_load_insert AFTER INSERT ON runs BEGIN {_INSERTED} END",
    f"""
    CREATE TRIGGER runs_user_load_update AFTER UPDATE OF state, owner ON runs
    WHEN {_CHANGED.replace("IS DISTINCT FROM", "IS NOT")} BEGIN {_UPDATED} END
    """,
    f"""
    CREATE TRIGGER runs_user_load_delete AFTER DELETE ON runs WHEN {_COUNTED}
    BEGIN {_DELETED} END
    """,
]


def upgrade() -> None:
    op.add_column("runs", sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("start_at", sa.Float(), nullable=True))
    op.add_column("runs", sa.Column("schedule_id", sa.String(64), nullable=True))
    op.drop_index("runs_ready", table_name="runs")
    op.drop_index("runs_queued", table_name="runs")
    op.create_index("runs_ready", "runs", _ORDER, postgresql_where=_READY, sqlite_where=_READY)
    op.create_index(
        "runs_ready_user",
        "runs",
        [sa.text("user_id"), *_ORDER],
        postgresql_where=_READY,
        sqlite_where=_READY,
    )
    op.create_index(
        "runs_queued", "runs", _ORDER, postgresql_where=_WAITS_THREAD, sqlite_where=_WAITS_THREAD
    )
    op.create_index(
        "runs_starting",
        "runs",
        ["start_at"],
        postgresql_where=_WAITS_START,
        sqlite_where=_WAITS_START,
    )
    op.create_index("runs_schedule", "runs", ["schedule_id"])
    op.create_table(
        "user_load",
        sa.Column("user_id", sa.String(128), primary_key=True),
        sa.Column("carried", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("ready", sa.Integer(), nullable=False, server_default="0"),
    )
    op.execute(
        "INSERT INTO user_load (user_id, carried, ready) SELECT user_id, "
        "SUM(CASE WHEN state = 'running' AND owner IS NOT NULL THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN state = 'running' AND owner IS NULL THEN 1 ELSE 0 END) "
        "FROM runs GROUP BY user_id"
    )
    for statement in _PG if op.get_bind().dialect.name == "postgresql" else _SQLITE:
        op.execute(statement)
    op.create_table(
        "model_usage",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("tokens", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.create_index("model_usage_at", "model_usage", ["at"])
    gates = op.create_table("gates", sa.Column("name", sa.String(32), primary_key=True))
    op.bulk_insert(gates, [{"name": "model"}])
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("cron", sa.String(255), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("limits", sa.JSON(), nullable=True),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_fired_at", sa.Float(), nullable=True),
        sa.Column("fired", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("missed", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_index("schedules_due", "schedules", ["next_at"])
    op.create_index("schedules_user", "schedules", ["user_id", "created_at"])


def downgrade() -> None:
    op.drop_table("schedules")
    op.drop_table("gates")
    op.drop_table("model_usage")
    for trigger in ("insert", "update", "delete"):
        op.execute(
            f"DROP TRIGGER IF EXISTS runs_user_load_{trigger}"
            + (" ON runs" if op.get_bind().dialect.name == "postgresql" else "")
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS tether_user_load()")
    op.drop_table("user_load")
    op.drop_index("runs_schedule", table_name="runs")
    op.drop_index("runs_starting", table_name="runs")
    op.drop_index("runs_queued", table_name="runs")
    op.drop_index("runs_ready_user", table_name="runs")
    op.drop_index("runs_ready", table_name="runs")
    ready = sa.text("state = 'running' AND owner IS NULL")
    op.create_index(
        "runs_ready", "runs", ["updated_at"], postgresql_where=ready, sqlite_where=ready
    )
    op.create_index(
        "runs_queued", "runs", ["updated_at"], postgresql_where=_QUEUED, sqlite_where=_QUEUED
    )
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("schedule_id")
        batch.drop_column("start_at")
        batch.drop_column("priority")
