"""Fixtures: a fresh migrated database per test on SQLite and on PostgreSQL.

Each backend's schema is built once per session (per xdist worker) by the real migrations:
a SQLite template file, copied per test, and a PostgreSQL template database, whose clones
a pool reuses between the tests of the session, emptied and renamed (tests/support/
pgpool.py). The suite fails, rather than skips, when PostgreSQL cannot be reached.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from pgpool import PgPool

from tether.sandbox import RunningSandbox, start_in_thread
from tether.store import Store, upgrade

PG_ADMIN_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite", "postgresql"]

# Property tests judge what a function returns, never how fast a loaded machine computes
# it: Hypothesis's per-example deadline would be a timed assertion.
settings.register_profile("untimed", deadline=None)
settings.load_profile("untimed")


def pytest_configure(config: pytest.Config) -> None:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise pytest.UsageError(
            f"PostgreSQL is not reachable at {PG_ADMIN_URL} ({exc}); the suite runs every store "
            "test on PostgreSQL and does not skip them. Start it with: pg_ctlcluster "
            "--skip-systemctl-redirect $(ls /etc/postgresql) main start"
        ) from exc


def _pg_url(dbname: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{dbname}"


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(scope="session")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Migrated template databases for both backends."""
    sqlite_path = tmp_path_factory.mktemp("template") / "template.db"
    store = Store(f"sqlite:///{sqlite_path}")
    upgrade(store.engine)
    store.close()
    pg_name = f"tether_tmpl_{os.getpid()}"
    _admin(f"DROP DATABASE IF EXISTS {pg_name} WITH (FORCE)")
    _admin(f"CREATE DATABASE {pg_name}")
    store = Store(_pg_url(pg_name))
    upgrade(store.engine)
    store.close()
    yield {"sqlite": str(sqlite_path), "postgresql": pg_name}
    _admin(f"DROP DATABASE IF EXISTS {pg_name} WITH (FORCE)")


@pytest.fixture(scope="session")
def pg_pool(templates: dict[str, str]) -> Iterator[PgPool]:
    """The session's reused PostgreSQL test databases, dropped at its end."""
    pool = PgPool(PG_ADMIN_URL, templates["postgresql"])
    try:
        yield pool
    finally:
        pool.close()


def _fresh(backend: str, templates: dict[str, str], pool: PgPool, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        path = tmp_path / "tether.db"
        shutil.copyfile(templates["sqlite"], path)
        yield f"sqlite:///{path}"
        return
    url = pool.take()
    try:
        yield url
    finally:
        pool.give_back(url)


@pytest.fixture(params=BACKENDS)
def db_url(
    request: pytest.FixtureRequest, templates: dict[str, str], pg_pool: PgPool, tmp_path: Path
) -> Iterator[str]:
    """A fresh migrated database, once on SQLite and once on PostgreSQL."""
    yield from _fresh(request.param, templates, pg_pool, tmp_path)


@pytest.fixture
def pg_url(templates: dict[str, str], pg_pool: PgPool, tmp_path: Path) -> Iterator[str]:
    """A fresh migrated PostgreSQL database."""
    yield from _fresh("postgresql", templates, pg_pool, tmp_path)


@pytest.fixture
def sqlite_url(templates: dict[str, str], pg_pool: PgPool, tmp_path: Path) -> Iterator[str]:
    """A fresh migrated SQLite database."""
    yield from _fresh("sqlite", templates, pg_pool, tmp_path)


@pytest.fixture
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema); parametrize indirectly with a backend name."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"tether_e_{uuid.uuid4().hex[:12]}"
    _admin(f"CREATE DATABASE {name}")
    try:
        yield _pg_url(name)
    finally:
        _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(autouse=True)
def effects_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test tools' own downstream database, shared with subprocesses via the env."""
    path = tmp_path / "effects.db"
    monkeypatch.setenv("KIT_EFFECTS_DB", str(path))
    return path


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    from tether import failpoints

    failpoints.clear_failpoints()
    yield
    failpoints.clear_failpoints()


@pytest.fixture(scope="session")
def sandbox_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSandbox]:
    """One sandbox CRM on a loopback port for the session; tests reset it to its seed."""
    with start_in_thread(str(tmp_path_factory.mktemp("sandbox") / "sandbox.db")) as running:
        yield running
