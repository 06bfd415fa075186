"""Schema migrations (Alembic) and the check that the schema matches this code."""

from __future__ import annotations

import enum
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from tether.errors import SchemaNotReady

MIGRATIONS = Path(__file__).parent / "migrations"


class SchemaStatus(str, enum.Enum):
    """How a database's schema compares with this code's."""

    EMPTY = "empty"  # no tether schema at all
    BEHIND = "behind"  # older than the code: run `tether migrate`
    CURRENT = "current"
    AHEAD = "ahead"  # newer than the code (or unknown revision): upgrade tether


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return cfg


def head_revision(engine: Engine) -> str:
    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def schema_status(engine: Engine) -> SchemaStatus:
    """Compare the database's Alembic revision with this code's head."""
    script = ScriptDirectory.from_config(alembic_config(engine))
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current is None:
        return SchemaStatus.EMPTY
    head = script.get_current_head()
    if current == head:
        return SchemaStatus.CURRENT
    known = {rev.revision for rev in script.walk_revisions()}
    return SchemaStatus.BEHIND if current in known else SchemaStatus.AHEAD


def upgrade(engine: Engine) -> None:
    """Apply every migration up to this code's head. Safe to run twice: Alembic applies
    only the revisions the database lacks."""
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def ensure_schema(engine: Engine, *, migrate_empty: bool) -> None:
    """Refuse to run on a schema that does not match this code, with a message that says
    what to do; migrate an empty database when ``migrate_empty``."""
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
