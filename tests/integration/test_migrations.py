"""Migrations build the schema from empty on both backends, and it equals the models'."""

from __future__ import annotations

import kit
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from tether.errors import SchemaNotReady
from tether.store import SchemaStatus, Store, schema_status, upgrade
from tether.store.schema import metadata


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_migrations_build_the_models_schema_from_empty(empty_url: str) -> None:
    store = Store(empty_url)
    assert schema_status(store.engine) is SchemaStatus.EMPTY
    upgrade(store.engine)
    upgrade(store.engine)  # running it twice changes nothing
    assert schema_status(store.engine) is SchemaStatus.CURRENT
    with store.engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), metadata
        )
    assert diff == []
    indexes = {ix["name"] for ix in sa.inspect(store.engine).get_indexes("runs")}
    assert {"runs_orphan_scan", "runs_ready", "runs_suspended_token", "runs_retention"} <= indexes
    store.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_the_engine_refuses_an_unmigrated_database_with_a_clear_message(empty_url: str) -> None:
    with pytest.raises(SchemaNotReady, match="tether migrate"):
        kit.engine(empty_url)


def test_the_engine_refuses_a_newer_schema(db_url: str) -> None:
    store = Store(db_url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'ffff_future'"))
    store.close()
    with pytest.raises(SchemaNotReady, match="newer"):
        kit.engine(db_url)


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_an_engine_may_migrate_an_empty_database_on_start(empty_url: str) -> None:
    from tether import Engine
    from tether.config import Settings

    engine = Engine(
        agent=kit.agent(),
        model=kit.script("answer"),
        settings=Settings(database_url=empty_url),
        migrate=True,
    )
    assert schema_status(engine.store.engine) is SchemaStatus.CURRENT
    engine.close()
