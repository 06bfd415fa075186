"""Each user's first waiting run in ``user_load`` (reference §13, fairness by default), so
a claim finds the users to take from in one index read, however long their backlogs.

``user_load`` gains the *head*: of the user's runs that wait for a worker (running, no
owner: those ``ready`` counts, a delayed one included), the first in the claim's order
(priority, highest first; ``updated_at``; id), NULL when none waits; its priority, age
and id (``head_priority``, ``head_since``, ``head_id``), and what tells whether a worker
may take it now (``head_version``, ``head_ready_at``). ``user_load_heads`` orders the
users with waiting runs by it (its priority, carried runs, its age, its id). Migration
0012's triggers are replaced by ones that keep the head as well, on the same changes plus
those of a waiting run's priority, age, version or delay:

- a run that starts waiting takes the head when it comes before the one there (no read);
- a run that stops waiting, or changes, while it is the head is replaced by the user's
  first waiting run: one probe of ``runs_ready_user``;
- a step of a carried run changes neither its state nor its owner: it fires nothing.

``runs_ready`` (every user's ready runs in the claim's order) goes: claims read the users
first, then each user's own ready runs (``runs_ready_user``), and every run made ready
or claimed paid for the index.

On PostgreSQL a change of a counted run first locks the user's row and reads its head, so
the probe that follows reads what a concurrent change of the same user committed, and
then writes the row once.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The head's columns and the run's columns they copy.
_HEAD = ("head_priority", "head_since", "head_id", "head_version", "head_ready_at")
_OF_RUN = ("priority", "updated_at", "id", "agent_version", "ready_at")
_KINDS: list[sa.types.TypeEngine[Any]] = [
    sa.Integer(),
    sa.Float(),
    sa.String(64),
    sa.String(128),
    sa.Float(),
]
# What fires the UPDATE trigger: a change of a count, or of what the head copies.
_WATCHED = ("state", "owner", "priority", "updated_at", "agent_version", "ready_at")
# As the store's schema (tether.store.sql.schema) orders the users; a migration never
# imports the code it migrates for.
_HEADS_ORDER: list[str | sa.TextClause] = [
    sa.text("head_priority DESC"),
    "carried",
    "head_since",
    "head_id",
]

# A run is carried while it is running under an owner, and waits (is ready) while it is
# running with none, as in migration 0012.
_CARRIED = "({row}.state = 'running' AND {row}.owner IS NOT NULL)"
_READY = "({row}.state = 'running' AND {row}.owner IS NULL)"
_WAITS_NEW = _READY.format(row="NEW")
_WAITED = _READY.format(row="OLD")


def _flag(test: str, row: str) -> str:
    return f"CASE WHEN {test.format(row=row)} THEN 1 ELSE 0 END"


def _delta(test: str) -> str:
    return f"({_flag(test, 'NEW')} - {_flag(test, 'OLD')})"


def _changed(distinct: str) -> str:
    """0012's condition: an UPDATE that changes a count."""
    return " OR ".join(
        f"{test.format(row='OLD')} {distinct} {test.format(row='NEW')}"
        for test in (_CARRIED, _READY)
    )


def _differ(distinct: str) -> str:
    """Whether an UPDATE changes a count, or what the head copies of a run that waits."""
    copied = " OR ".join(f"OLD.{column} {distinct} NEW.{column}" for column in _WATCHED[2:])
    return f"{_changed(distinct)} OR (({_WAITED} OR {_WAITS_NEW}) AND ({copied}))"


def _before(first: tuple[str, ...], second: tuple[str, ...]) -> str:
    """Whether the run ``first`` (its priority, since, id) comes before ``second`` in the
    claim's order."""
    return "(-{}, {}, {}) < (-{}, {}, {})".format(*first[:3], *second[:3])


_NEW = tuple(f"NEW.{column}" for column in _OF_RUN)
_COUNT = (
    "INSERT INTO user_load (user_id, carried, ready) VALUES ({who}, {carried}, {ready}) "
    "ON CONFLICT (user_id) DO UPDATE SET carried = user_load.carried + excluded.carried, "
    "ready = user_load.ready + excluded.ready;"
)
_COUNT_NEW = _COUNT.format(
    who="NEW.user_id", carried=_flag(_CARRIED, "NEW"), ready=_flag(_READY, "NEW")
)
_UPDATED = _COUNT.format(who="NEW.user_id", carried=_delta(_CARRIED), ready=_delta(_READY))
_DELETED = _COUNT.format(
    who="OLD.user_id", carried=f"-{_flag(_CARRIED, 'OLD')}", ready=f"-{_flag(_READY, 'OLD')}"
)
_COUNTED = f"{_CARRIED.format(row='OLD')} OR {_READY.format(row='OLD')}"

# A new run: counted, and the head when it waits and comes first (one statement).
_TAKES = (
    "excluded.head_id IS NOT NULL AND (user_load.head_id IS NULL OR "
    + _before(tuple(f"excluded.{c}" for c in _HEAD), tuple(f"user_load.{c}" for c in _HEAD))
    + ")"
)
_INSERTED = (
    f"INSERT INTO user_load (user_id, carried, ready, {', '.join(_HEAD)}) "
    f"VALUES (NEW.user_id, {_flag(_CARRIED, 'NEW')}, {_flag(_READY, 'NEW')}, "
    + ", ".join(f"CASE WHEN {_WAITS_NEW} THEN {value} END" for value in _NEW)
    + ") ON CONFLICT (user_id) DO UPDATE SET carried = user_load.carried + excluded.carried, "
    "ready = user_load.ready + excluded.ready, "
    + ", ".join(
        f"{column} = CASE WHEN {_TAKES} THEN excluded.{column} ELSE user_load.{column} END"
        for column in _HEAD
    )
    + ";"
)
# The user's first waiting run now (one probe of ``runs_ready_user``; none: NULL).
_FIRST = (
    f"SELECT {', '.join(_OF_RUN)} FROM runs WHERE user_id = {{who}} "
    "AND state = 'running' AND owner IS NULL ORDER BY priority DESC, updated_at, id LIMIT 1"
)

# PostgreSQL: one function for the three triggers (see the module's docstring).
_FOUND = ("first_p", "first_s", "first_i", "first_v", "first_r")
_PG_HEADS = """
CREATE OR REPLACE FUNCTION tether_user_load() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  who varchar; more_carried integer; more_ready integer;
  first_p integer; first_s double precision; first_i varchar; first_v varchar;
  first_r double precision;
BEGIN
  IF TG_OP = 'INSERT' THEN
    {inserted}
    RETURN NULL;
  END IF;
  IF TG_OP = 'UPDATE' THEN
    who := NEW.user_id; more_carried := {carried}; more_ready := {ready};
  ELSE
    who := OLD.user_id; more_carried := -{carried_old}; more_ready := -{ready_old};
  END IF;
  SELECT {head} INTO {found} FROM user_load WHERE user_id = who FOR UPDATE;
  IF NOT FOUND THEN  -- no row yet (0012's upsert allowed for it): counted from here
    {missing}
    UPDATE user_load SET ({head}) = ({first}) WHERE user_id = who;
  ELSIF first_i = OLD.id THEN  -- the head stopped waiting or changed: the first now
    UPDATE user_load SET carried = carried + more_carried, ready = ready + more_ready,
      ({head}) = ({first}) WHERE user_id = who;
  ELSIF TG_OP = 'UPDATE' AND {waits} AND (first_i IS NULL OR {comes_first}) THEN
    UPDATE user_load SET carried = carried + more_carried, ready = ready + more_ready,
      {new_head} WHERE user_id = who;
  ELSE
    UPDATE user_load SET carried = carried + more_carried, ready = ready + more_ready
      WHERE user_id = who;
  END IF;
  RETURN NULL;
END $$
""".format(
    inserted=_INSERTED,
    carried=_delta(_CARRIED),
    ready=_delta(_READY),
    carried_old=_flag(_CARRIED, "OLD"),
    ready_old=_flag(_READY, "OLD"),
    head=", ".join(_HEAD),
    found=", ".join(_FOUND),
    missing=_COUNT.format(who="who", carried="more_carried", ready="more_ready"),
    first=_FIRST.format(who="who"),
    waits=_WAITS_NEW,
    comes_first=_before(_NEW, _FOUND),
    new_head=", ".join(f"{c} = {v}" for c, v in zip(_HEAD, _NEW, strict=True)),
)
# 0012's function: the counts alone.
_PG_COUNTS = f"""
CREATE OR REPLACE FUNCTION tether_user_load() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN {_COUNT_NEW}
  ELSIF TG_OP = 'UPDATE' THEN {_UPDATED}
  ELSE {_DELETED}
  END IF;
  RETURN NULL;
END $$
"""

# SQLite: the statements of each trigger, in order (writers are serialised there).
_SQLITE_REPLACED = (
    f"UPDATE user_load SET ({', '.join(_HEAD)}) = ({_FIRST.format(who='OLD.user_id')}) "
    "WHERE user_id = OLD.user_id AND head_id = OLD.id;"
)
_SQLITE_OFFERED = (
    "UPDATE user_load SET "
    + ", ".join(f"{c} = {v}" for c, v in zip(_HEAD, _NEW, strict=True))
    + f" WHERE user_id = NEW.user_id AND {_WAITS_NEW} AND (head_id IS NULL OR "
    + _before(_NEW, _HEAD)
    + ");"
)


def _pg(heads: bool) -> list[str]:
    """PostgreSQL's function and triggers, keeping the heads or (0012's) only the counts."""
    changes = ", ".join(_WATCHED if heads else _WATCHED[:2])
    when = _differ("IS DISTINCT FROM") if heads else _changed("IS DISTINCT FROM")
    return [
        _PG_HEADS if heads else _PG_COUNTS,
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


def _sqlite(heads: bool) -> list[str]:
    """SQLite's triggers, keeping the heads or (0012's) only the counts."""
    inserted = _INSERTED if heads else _COUNT_NEW
    updated, deleted = _UPDATED, _DELETED
    if heads:
        updated += f" {_SQLITE_REPLACED} {_SQLITE_OFFERED}"
        deleted += f" {_SQLITE_REPLACED}"
    changes = ", ".join(_WATCHED if heads else _WATCHED[:2])
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


def _drop_triggers() -> None:
    on = " ON runs" if op.get_bind().dialect.name == "postgresql" else ""
    for trigger in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS runs_user_load_{trigger}{on}")


def _create_triggers(heads: bool) -> None:
    """The triggers of ``user_load`` that keep the heads, or (0012's) only the counts."""
    postgres = op.get_bind().dialect.name == "postgresql"
    for statement in _pg(heads) if postgres else _sqlite(heads):
        op.execute(statement)


# All users' ready runs in the claim's order: no claim reads it any more (a claim goes
# through the users), and every run made ready or claimed paid for it.
_RUNS_READY_ORDER: list[str | sa.TextClause] = [sa.text("priority DESC"), "updated_at"]
_RUNS_READY = sa.text("state = 'running' AND owner IS NULL")


def upgrade() -> None:
    op.drop_index("runs_ready", table_name="runs")
    for column, kind in zip(_HEAD, _KINDS, strict=True):
        op.add_column("user_load", sa.Column(column, kind, nullable=True))
    op.execute(
        f"UPDATE user_load SET ({', '.join(_HEAD)}) = ({_FIRST.format(who='user_load.user_id')})"
    )
    where = sa.text("ready > 0")
    op.create_index(
        "user_load_heads", "user_load", _HEADS_ORDER, postgresql_where=where, sqlite_where=where
    )
    _drop_triggers()
    _create_triggers(heads=True)


def downgrade() -> None:
    # The triggers first: SQLite's batch mode re-creates ``user_load``, which a trigger
    # naming it would not survive.
    _drop_triggers()
    op.drop_index("user_load_heads", table_name="user_load")
    with op.batch_alter_table("user_load") as batch:
        for column in reversed(_HEAD):
            batch.drop_column(column)
    _create_triggers(heads=False)
    op.create_index(
        "runs_ready",
        "runs",
        _RUNS_READY_ORDER,
        postgresql_where=_RUNS_READY,
        sqlite_where=_RUNS_READY,
    )
