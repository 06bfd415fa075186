"""Each user's first waiting run in ``user_load`` (reference §23, fairness by default), so
a claim finds the users to take from in one index read, however long their backlogs.

``user_load`` gains ``head_priority``, ``head_since`` and ``head_id``: of the user's runs
that wait for a worker (running, no owner: those ``ready`` counts, a delayed one
included), the first in the claim's order (priority, highest first; ``updated_at``; id),
NULL when none waits. ``user_load_heads`` orders the users with waiting runs by it
(priority of that run, carried runs, its age, its id). Migration 0012's triggers are
replaced by ones that keep the head as well, on the same changes plus those of a
waiting run's priority or age:

- a run that starts waiting takes the head when it comes before the one there (no read);
- a run that stops waiting, or whose place changes, while it is the head is replaced by
  the user's first waiting run, one probe of ``runs_ready_user``;
- a carried run's step changes neither its state nor its owner: its UPDATE fires nothing.

On PostgreSQL the count's upsert comes first in every firing: it locks the user's row, so
the probe that follows reads what a concurrent change of the same user committed.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_HEAD = ("head_priority", "head_since", "head_id")
# As the store's schema (tether.store.sql.schema) orders the users; a migration never
# imports the code it migrates for.
_HEADS_ORDER = [sa.text("head_priority DESC"), "carried", "head_since", "head_id"]

# A run is carried while it is running under an owner, and waits (is ready) while it is
# running with none, as in migration 0012.
_CARRIED = "({row}.state = 'running' AND {row}.owner IS NOT NULL)"
_READY = "({row}.state = 'running' AND {row}.owner IS NULL)"


def _flag(test: str, row: str) -> str:
    return f"CASE WHEN {test.format(row=row)} THEN 1 ELSE 0 END"


def _delta(test: str) -> str:
    return f"({_flag(test, 'NEW')} - {_flag(test, 'OLD')})"


def _differ(distinct: str) -> str:
    """Whether an UPDATE changes a count, or the place of a run that waits before or after."""
    changed = " OR ".join(
        f"{test.format(row='OLD')} {distinct} {test.format(row='NEW')}"
        for test in (_CARRIED, _READY)
    )
    moved = f"OLD.priority {distinct} NEW.priority OR OLD.updated_at {distinct} NEW.updated_at"
    waits = f"{_READY.format(row='OLD')} OR {_READY.format(row='NEW')}"
    return f"{changed} OR (({waits}) AND ({moved}))"


def _before(first: tuple[str, str, str], second: tuple[str, str, str]) -> str:
    """Whether the run ``first`` (its priority, since, id) comes before ``second`` in the
    claim's order."""
    return "(-{}, {}, {}) < (-{}, {}, {})".format(*first, *second)


def _head_of(prefix: str) -> tuple[str, str, str]:
    return (f"{prefix}head_priority", f"{prefix}head_since", f"{prefix}head_id")


_COUNT = (
    "INSERT INTO user_load (user_id, carried, ready) VALUES ({who}, {carried}, {ready}) "
    "ON CONFLICT (user_id) DO UPDATE SET carried = user_load.carried + excluded.carried, "
    "ready = user_load.ready + excluded.ready;"
)
# A new run: counted, and the head when it waits and comes first (one statement).
_WAITS_NEW = _READY.format(row="NEW")
_NEW_HEAD = ", ".join(
    f"CASE WHEN {_WAITS_NEW} THEN NEW.{column} END" for column in ("priority", "updated_at", "id")
)
_TAKES = (
    "excluded.head_id IS NOT NULL AND (user_load.head_id IS NULL OR "
    + _before(_head_of("excluded."), _head_of("user_load."))
    + ")"
)
_INSERTED = (
    "INSERT INTO user_load (user_id, carried, ready, head_priority, head_since, head_id) "
    f"VALUES (NEW.user_id, {_flag(_CARRIED, 'NEW')}, {_flag(_READY, 'NEW')}, {_NEW_HEAD}) "
    "ON CONFLICT (user_id) DO UPDATE SET carried = user_load.carried + excluded.carried, "
    "ready = user_load.ready + excluded.ready, "
    + ", ".join(
        f"{column} = CASE WHEN {_TAKES} THEN excluded.{column} ELSE user_load.{column} END"
        for column in _HEAD
    )
    + ";"
)
_UPDATED = _COUNT.format(who="NEW.user_id", carried=_delta(_CARRIED), ready=_delta(_READY))
_DELETED = _COUNT.format(
    who="OLD.user_id", carried=f"-{_flag(_CARRIED, 'OLD')}", ready=f"-{_flag(_READY, 'OLD')}"
)
_COUNTED = f"{_CARRIED.format(row='OLD')} OR {_READY.format(row='OLD')}"
# The run that was the head no longer is, or moved: the user's first waiting run now (one
# probe of ``runs_ready_user``; NULL when none waits).
_FIRST = (
    "SELECT priority, updated_at, id FROM runs WHERE user_id = {who} "
    "AND state = 'running' AND owner IS NULL ORDER BY priority DESC, updated_at, id LIMIT 1"
)
_REPLACED = (
    f"UPDATE user_load SET ({', '.join(_HEAD)}) = ({_FIRST.format(who='OLD.user_id')}) "
    "WHERE user_id = OLD.user_id AND head_id = OLD.id;"
)
# A run that waits now takes the head when it comes first.
_OFFERED = (
    "UPDATE user_load SET head_priority = NEW.priority, head_since = NEW.updated_at, "
    "head_id = NEW.id WHERE user_id = NEW.user_id AND {waits}(head_id IS NULL OR "
    + _before(("NEW.priority", "NEW.updated_at", "NEW.id"), _head_of(""))
    + ");"
)


def _pg(heads: bool) -> list[str]:
    """PostgreSQL's function and triggers, keeping the heads or (0012's) only the counts."""
    inserted = (
        _INSERTED
        if heads
        else _COUNT.format(
            who="NEW.user_id", carried=_flag(_CARRIED, "NEW"), ready=_flag(_READY, "NEW")
        )
    )
    updated, deleted = _UPDATED, _DELETED
    if heads:
        updated += (
            f" IF {_READY.format(row='OLD')} THEN {_REPLACED} END IF;"
            f" IF {_WAITS_NEW} THEN {_OFFERED.format(waits='')} END IF;"
        )
        deleted += f" IF {_READY.format(row='OLD')} THEN {_REPLACED} END IF;"
    changes = "state, owner, priority, updated_at" if heads else "state, owner"
    when = _differ("IS DISTINCT FROM") if heads else _changed("IS DISTINCT FROM")
    return [
        f"""
        CREATE OR REPLACE FUNCTION tether_user_load() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF TG_OP = 'INSERT' THEN {inserted}
          ELSIF TG_OP = 'UPDATE' THEN {updated}
          ELSE {deleted}
          END IF;
          RETURN NULL;
        END $$
        """,
        """
        CREATE TRIGGER runs_user_load_insert AFTER INSERT ON runs
        FOR EACH ROW EXECUTE FUNCTION tether_user_load()
        """,
        f"""
        CREATE TRIGGER runs_user_load_update AFTER UPDATE OF {changes} ON runs
        FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION tether_user_load()
        """,
        f"""
        CREATE TRIGGER runs_user_load_delete AFTER DELETE ON runs
        FOR EACH ROW WHEN ({_COUNTED}) EXECUTE FUNCTION tether_user_load()
        """,
    ]


def _changed(distinct: str) -> str:
    """0012's condition: an UPDATE that changes a count."""
    return " OR ".join(
        f"{test.format(row='OLD')} {distinct} {test.format(row='NEW')}"
        for test in (_CARRIED, _READY)
    )


def _sqlite(heads: bool) -> list[str]:
    """SQLite's triggers, keeping the heads or (0012's) only the counts."""
    inserted = (
        _INSERTED
        if heads
        else _COUNT.format(
            who="NEW.user_id", carried=_flag(_CARRIED, "NEW"), ready=_flag(_READY, "NEW")
        )
    )
    updated, deleted = _UPDATED, _DELETED
    if heads:
        updated += f" {_REPLACED} {_OFFERED.format(waits=_WAITS_NEW + ' AND ')}"
        deleted += f" {_REPLACED}"
    changes = "state, owner, priority, updated_at" if heads else "state, owner"
    when = _differ("IS NOT") if heads else _changed("IS NOT")
    return [
        f"CREATE TRIGGER runs_user_load_insert AFTER INSERT ON runs BEGIN {inserted} END",
        f"""
        CREATE TRIGGER runs_user_load_update AFTER UPDATE OF {changes} ON runs
        WHEN {when} BEGIN {updated} END
        """,
        f"""
        CREATE TRIGGER runs_user_load_delete AFTER DELETE ON runs WHEN {_COUNTED}
        BEGIN {deleted} END
        """,
    ]


def _triggers(heads: bool) -> None:
    """Replace the triggers of ``user_load`` with the ones that keep the heads, or not."""
    postgres = op.get_bind().dialect.name == "postgresql"
    for trigger in ("insert", "update", "delete"):
        op.execute(
            f"DROP TRIGGER IF EXISTS runs_user_load_{trigger}" + (" ON runs" if postgres else "")
        )
    for statement in _pg(heads) if postgres else _sqlite(heads):
        op.execute(statement)


def upgrade() -> None:
    for column in _HEAD:
        kind = {"head_priority": sa.Integer(), "head_since": sa.Float()}.get(column, sa.String(64))
        op.add_column("user_load", sa.Column(column, kind, nullable=True))
    op.execute(
        f"UPDATE user_load SET ({', '.join(_HEAD)}) = ({_FIRST.format(who='user_load.user_id')})"
    )
    where = sa.text("ready > 0")
    op.create_index(
        "user_load_heads", "user_load", _HEADS_ORDER, postgresql_where=where, sqlite_where=where
    )
    _triggers(heads=True)


def downgrade() -> None:
    _triggers(heads=False)
    op.drop_index("user_load_heads", table_name="user_load")
    with op.batch_alter_table("user_load") as batch:
        for column in reversed(_HEAD):
            batch.drop_column(column)
