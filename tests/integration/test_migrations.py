"""Migrations build the schema from empty on both backends, and it equals the models'."""

from __future__ import annotations

from typing import Any

import agents
import inprocess
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from store_runs import stored_heads, stored_load, true_heads, true_load

from tether.errors import SchemaNotReady
from tether.store import SchemaStatus, Store, schema_status, upgrade
from tether.store.migrate import alembic_config
from tether.store.sql.schema import metadata


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
    expected = {"runs_orphan_scan", "runs_ready_user", "runs_suspended_expiry", "runs_retention"}
    assert expected | {"runs_state"} <= indexes
    store.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
async def test_the_engine_refuses_an_unmigrated_database_with_a_clear_message(
    empty_url: str,
) -> None:
    engine = inprocess.engine(empty_url)
    with pytest.raises(SchemaNotReady, match="tether migrate"):
        await engine.open()
    engine.close()


async def test_the_engine_refuses_a_newer_schema(db_url: str) -> None:
    store = Store(db_url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'ffff_future'"))
    store.close()
    engine = inprocess.engine(db_url)
    with pytest.raises(SchemaNotReady, match="newer"):
        await engine.open()
    engine.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
async def test_an_engine_may_migrate_an_empty_database_on_start(empty_url: str) -> None:
    from tether import Engine
    from tether.config import Settings

    engine = Engine(
        agent=agents.agent(),
        model=agents.script("answer"),
        settings=Settings(database_url=empty_url),
        migrate=True,
    )
    await engine.open()
    assert schema_status(engine.runner.store.engine) is SchemaStatus.CURRENT
    engine.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_migration_0003_keeps_existing_runs_and_adds_ready_at(empty_url: str) -> None:
    store = Store(empty_url)
    cfg = alembic_config(store.engine)
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
    with store.engine.begin() as conn:
        conn.execute(sa.text(_OLD_RUN))
    upgrade(store.engine)
    run = store.get_run("r1")
    assert run is not None and run.state.value == "running" and run.owner is None
    assert store.claim_ready("w1") is not None  # ready_at NULL: claimable at once
    assert store.count_by_state()["running"] == 1
    store.close()


_OLD_RUN = """
INSERT INTO runs (id, user_id, question, route, state, step, max_steps, max_spend_usd,
    max_tool_calls, max_elapsed_ms, steps, spend_usd, tool_calls, elapsed_ms, scope_snapshot,
    scope_resolved_at, recovery_attempts, lease_epoch, versions, message_count, started_at,
    updated_at)
VALUES ('r1', 'dana', 'q', '{}', 'running', 0, 5, 1.0, 5, 1000, 0, 0, 0, 0, '{}', 1.0, 0, 0,
    '{}', 0, 1.0, 1.0)
"""


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_migration_0008_keeps_users_and_keys_and_adds_revocable_sessions(empty_url: str) -> None:
    from tether.store.users import hash_key

    store = Store(empty_url)
    cfg = alembic_config(store.engine)
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006")
        # A user and key as 0006 stored them (the code's ``add_user`` needs 0013's tables).
        conn.execute(sa.text("INSERT INTO users (id, created_at) VALUES ('dana', 1)"))
        conn.execute(
            sa.text("INSERT INTO api_keys (key_hash, user_id, created_at) VALUES (:h, 'dana', 1)"),
            {"h": hash_key("tth_kept-key")},
        )
    upgrade(store.engine)
    assert store.user_for_key("tth_kept-key") == "dana"
    assert store.open_sign_in("tth_kept-key", hash_key("sid"), 3600) == "dana"
    assert store.sign_in_user(hash_key("sid")) == "dana"
    assert store.rotate_key("dana", "tth_new-key")
    assert store.sign_in_user(hash_key("sid")) is None
    store.close()


def test_the_schema_checks_revision_list_is_alembics_chain(sqlite_url: str) -> None:
    from alembic.script import ScriptDirectory

    from tether.store.migrate import REVISIONS, head_revision

    store = Store(sqlite_url)
    try:
        script = ScriptDirectory.from_config(alembic_config(store.engine))
        chain = [rev.revision for rev in script.walk_revisions()]
        assert tuple(reversed(chain)) == REVISIONS
        assert head_revision(store.engine) == REVISIONS[-1]
    finally:
        store.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_each_older_revision_is_behind_and_an_unknown_one_is_ahead(empty_url: str) -> None:
    from tether.store.migrate import REVISIONS

    store = Store(empty_url)
    try:
        cfg = alembic_config(store.engine)
        for older in REVISIONS[:-1]:
            with store.engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, older)
            assert schema_status(store.engine) is SchemaStatus.BEHIND
        upgrade(store.engine)
        assert schema_status(store.engine) is SchemaStatus.CURRENT
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
        assert schema_status(store.engine) is SchemaStatus.AHEAD
    finally:
        store.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
async def test_migration_0007_keeps_registered_workers_with_their_tools_unknown(
    empty_url: str,
) -> None:
    """A worker registered before 0007 serves its version still, but its tools are
    unknown: a suspended run is not moved onto it until it registers again."""
    import versioned

    from tether import StopKind
    from tether.errors import InvalidInput

    store = Store(empty_url)
    cfg = alembic_config(store.engine)
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006")
    now = store.now()
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO workers (worker_id, version, started_at, heartbeat_at) "
                "VALUES ('w-old', 'kit@v2', :now, :now)"
            ),
            {"now": now},
        )
    upgrade(store.engine)
    with store.engine.connect() as conn:
        tools = conn.execute(sa.text("SELECT tools FROM workers")).scalars().all()
    assert tools == [None]
    assert store.live_versions(stale_after_s=600) == ["kit@v2"]
    send: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("send", item="b")]},
        {"content": "sent"},
    ]
    engine = versioned.engine(empty_url, versioned.v1(), turns=send, heartbeat_timeout_s=600)
    try:
        outcome = await engine.ask("dana", "send it")
        assert outcome.kind is StopKind.SUSPENDED
        with pytest.raises(InvalidInput, match="registered no tools"):
            await engine.operator.move_run(outcome.run_id, "kit@v2", user="ops")
        store.register_worker("w-old", ["kit@v2"], ["send"])
        moved = await engine.operator.move_run(outcome.run_id, "kit@v2", user="ops")
        assert moved.agent_version == "kit@v2"
    finally:
        engine.close()
        store.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_migration_0012_counts_the_runs_in_flight_per_user(empty_url: str) -> None:
    store = Store(empty_url)
    cfg = alembic_config(store.engine)
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0011")
    with store.engine.begin() as conn:
        conn.execute(sa.text(_OLD_RUN))  # ready
        conn.execute(sa.text(_OLD_RUN.replace("'r1'", "'r2'")))
        conn.execute(sa.text("UPDATE runs SET owner = 'w0' WHERE id = 'r2'"))  # carried
    upgrade(store.engine)
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT user_id, carried, ready FROM user_load")).all()
    assert [tuple(r) for r in rows] == [("dana", 1, 1)]
    run = store.claim_ready("w1", cap=2)
    assert run is not None and run.id == "r1" and run.priority == 0 and run.start_at is None
    assert store.claim_ready("w2", cap=2) is None  # nothing left, and dana is at the cap
    store.close()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_migration_0018_finds_each_users_first_waiting_run_and_goes_back(empty_url: str) -> None:
    store = Store(empty_url)
    cfg = alembic_config(store.engine)
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0017")
    # (id, user, priority, age, state, owner): dana's first waiting run is her most urgent;
    # eve's two tie on priority and age, the first by id; lee's only run does not wait.
    made = [
        ("r1", "dana", 0, 3.0, "running", None),
        ("r2", "dana", 1, 5.0, "running", None),
        ("r3", "dana", 0, 1.0, "running", "w0"),
        ("r5", "eve", 0, 2.0, "running", None),
        ("r4", "eve", 0, 2.0, "running", None),
        ("r6", "lee", 0, 1.0, "suspended", None),
    ]
    with store.engine.begin() as conn:
        for run_id, user, priority, age, state, owner in made:
            conn.execute(sa.text(_OLD_RUN.replace("'r1', 'dana'", f"'{run_id}', '{user}'")))
            conn.execute(
                sa.text(
                    "UPDATE runs SET priority = :p, updated_at = :age, state = :state, "
                    "owner = :owner WHERE id = :id"
                ),
                {"p": priority, "age": age, "state": state, "owner": owner, "id": run_id},
            )
    upgrade(store.engine)
    heads = {user: head[2] for user, head in stored_heads(store).items()}
    assert heads == {"dana": "r2", "eve": "r4"}
    assert stored_heads(store) == true_heads(store)
    assert stored_load(store) == true_load(store) == {"dana": (1, 2), "eve": (0, 2)}
    with store.engine.begin() as conn:  # and back: 0017's schema, counted by 0012's triggers
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0017")
    assert store.claim_ready("w1", "r2") is not None
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT user_id, carried, ready FROM user_load")).all()
    assert sorted(tuple(r) for r in rows) == [("dana", 2, 1), ("eve", 0, 2), ("lee", 0, 0)]
    upgrade(store.engine)
    assert {user: head[2] for user, head in stored_heads(store).items()} == {
        "dana": "r1",
        "eve": "r4",
    }
    store.close()
