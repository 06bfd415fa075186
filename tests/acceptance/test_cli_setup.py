"""What people meet setting tether up, through the real CLI: a wrong database URL, a
missing SQLite file."""

from __future__ import annotations

import uuid
from pathlib import Path

import processes
import pytest

from tether.store import SchemaStatus, Store, schema_status


def _missing_pg_database() -> str:
    from conftest import PG_ADMIN_URL

    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/tether_missing_{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("command", [("runs", "list"), ("serve", "--port", "0")])
def test_a_postgresql_database_that_does_not_exist_is_refused_at_once_not_retried(
    command: tuple[str, ...],
) -> None:
    url = _missing_pg_database()
    name = url.rpartition("/")[2]
    done = processes.tether(*command, env=processes.tether_env(url), timeout=120)
    assert done.returncode == 1
    assert "database_misconfigured" in done.stderr
    assert f'database "{name}" does not exist' in done.stderr
    assert f"createdb {name}" in done.stderr
    assert "retrying" not in done.stderr and "database_unavailable" not in done.stderr


def test_a_database_url_that_cannot_be_parsed_is_invalid_config() -> None:
    url = "postgresql://tether:secret@127.0.0.1:notaport/tether"
    done = processes.tether("runs", "list", env=processes.tether_env(url))
    assert done.returncode == 1, done.stderr
    assert "invalid_config" in done.stderr and "cannot be parsed" in done.stderr
    assert "secret" not in done.stderr and "Traceback" not in done.stderr


def test_reading_commands_never_create_a_sqlite_file_and_say_how_to_make_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "not" / "here" / "tether.db"
    env = processes.tether_env(f"sqlite:///{path}")
    for command in (("runs", "list"), ("runs", "show", "abc")):
        done = processes.tether(*command, env=env)
        assert done.returncode == 1
        assert "schema_not_ready" in done.stderr
        assert str(path) in done.stderr and "tether migrate" in done.stderr
    assert not (tmp_path / "not").exists()

    migrated = processes.tether("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    store = Store(f"sqlite:///{path}")
    assert schema_status(store.engine) is SchemaStatus.CURRENT
    store.close()
    listed = processes.tether("runs", "list", env=env)
    assert listed.returncode == 0, listed.stderr
