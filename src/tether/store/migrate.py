"""Schema migrations (Alembic) and the check that the schema matches this code.

Checking the schema is one indexed read of ``alembic_version`` against ``REVISIONS``, so
a process that starts on a current database never loads Alembic (a large part of the
import time of a ``tether`` command); Alembic is imported only to migrate.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tether.errors import SchemaNotReady
from tether.store.backend.connect import READ, check_folder, sqlite_file

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"

# The revisions of migrations/versions, oldest first; the last is this code's head.
# tests/integration/test_migrations.py checks this against Alembic's own chain.
REVISIONS = (
    "0001",
    "0002",
    "0003",
    "0004",
    "0005",
    "0006",
    "0007",
    "0008",
    "0009",
    "0010",
    "0011",
    "0012",
    "0013",
    "0014",
    "0015",
    "0016",
    "0017",
    "0018",
)
_VERSION = sa.text("SELECT version_num FROM alembic_version")


class SchemaStatus(str, enum.Enum):
    """How a database's schema compares with this code's."""

    EMPTY = "empty"  # no tether schema at all
    BEHIND = "behind"  # older than the code: run `tether migrate`
    CURRENT = "current"
    AHEAD = "ahead"  # newer than the code (or unknown revision): upgrade tether


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return cfg


def head_revision(engine: Engine) -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def schema_status(engine: Engine) -> SchemaStatus:
    """Compare the database's Alembic revision with this code's head: one statement (a
    database without the table is empty), outside any transaction, so a process that
    opens a current database pays one round trip for the check."""
    try:
        with engine.connect().execution_options(
            isolation_level="AUTOCOMMIT", **{READ: True}
        ) as conn:
            current = conn.execute(_VERSION).scalar()
    except sa.exc.DBAPIError as exc:
        if _no_table(exc):
            return SchemaStatus.EMPTY
        raise
    if current is None:
        return SchemaStatus.EMPTY
    if current == REVISIONS[-1]:
        return SchemaStatus.CURRENT
    return SchemaStatus.BEHIND if current in REVISIONS else SchemaStatus.AHEAD


def _no_table(exc: sa.exc.DBAPIError) -> bool:
    """Whether ``exc`` says the table read does not exist (and nothing else went wrong)."""
    if getattr(exc.orig, "sqlstate", None) == "42P01":  # PostgreSQL's undefined_table
        return True
    return "no such table" in str(exc.orig)  # SQLite's


def upgrade(engine: Engine) -> None:
    """Apply every migration up to this code's head. Safe to run twice: Alembic applies
    only the revisions the database lacks."""
    from alembic import command

    check_folder(engine)
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def ensure_schema(engine: Engine, *, migrate_empty: bool) -> None:
    """Refuse to run on a schema that does not match this code, with a message that says
    what to do; migrate an empty database when ``migrate_empty``. A SQLite file that does
    not exist is created only then, in a folder that exists: reading a database never
    creates one, and nothing creates a folder."""
    missing = sqlite_file(engine)
    if missing is not None and not missing.exists():
        if not migrate_empty:
            raise SchemaNotReady(
                f"the database file {missing} does not exist: `tether migrate` creates it "
                "(or check TETHER_DATABASE_URL)"
            )
        check_folder(engine)
    status = schema_status(engine)
    if status is SchemaStatus.CURRENT:
        return
    if status is SchemaStatus.EMPTY and migrate_empty:
        upgrade(engine)
        return
    url = engine.url.render_as_string(hide_password=True)
    if status is SchemaStatus.EMPTY:
        raise SchemaNotReady(f"the database {url} has no tether schema: run `tether migrate`")
    if status is SchemaStatus.BEHIND:
        raise SchemaNotReady(f"the database {url} has an older tether schema: run `tether migrate`")
    raise SchemaNotReady(
        f"the database {url} has a schema newer than this tether: upgrade tether first"
    )
