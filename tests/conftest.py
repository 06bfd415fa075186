"""Fixtures: a fresh migrated database per test on SQLite and on PostgreSQL.

Each backend's schema is built once per session (per xdist worker) by the real migrations:
a SQLite template file, copied per test, and a PostgreSQL template database, whose clones
a pool reuses between the tests of the session, emptied and renamed (tests/support/
pgpool.py). The suite fails, rather than skips, when PostgreSQL cannot be reached.
"""

from __future__ import annotations

import inspect
import multiprocessing.util
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-processes",
        action="store_true",
        help="run only the tests that start no process (those not marked `processes`), and "
        "fail any of them that starts one: `make check`, the inner loop",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("no_processes"):
        _refuse_processes()
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


# -- the tests that start processes --------------------------------------------------------
# `make check` runs the tests that start no process of their own (no `tether` CLI, server,
# PgBouncer, browser or Python interpreter). A test is marked `processes` by what it uses,
# so that a new test needs no list kept by hand: its tier (the acceptance and browser tests
# start processes by design), or a name in its code, its fixtures' or the test helpers'
# these call, that is `subprocess`, `multiprocessing`, or a module of the tests importing
# one of them (the support that runs the CLI, PgBouncer, the MCP test server...). Under
# --no-processes a test that starts a process all the same fails, saying so.

TESTS = Path(__file__).resolve().parent
PROCESS_TIERS = frozenset({"acceptance", "browser"})
STARTERS = frozenset({"subprocess", "multiprocessing"})


def _ours(filename: str | None) -> bool:
    return filename is not None and Path(filename).resolve().is_relative_to(TESTS)


def _is_starter(module: Any) -> bool:
    return isinstance(module, ModuleType) and module.__name__.partition(".")[0] in STARTERS


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _leads_to_a_process(obj: Any, seen: set[CodeType]) -> bool:
    """Whether ``obj``, a name some test code uses, starts processes or leads to what does."""
    if isinstance(obj, ModuleType):
        return _is_starter(obj) or (
            _ours(getattr(obj, "__file__", None)) and any(map(_is_starter, vars(obj).values()))
        )
    if str(getattr(obj, "__module__", "")).partition(".")[0] in STARTERS:
        return True  # e.g. `from subprocess import run`
    if isinstance(obj, type):  # a class of the tests leads where its methods do
        methods = [getattr(m, "__func__", m) for m in vars(obj).values()]
        return any(_leads_to_a_process(m, seen) for m in methods if inspect.isfunction(m))
    func = inspect.unwrap(obj) if inspect.isfunction(obj) else None
    code = getattr(func, "__code__", None)
    if not isinstance(code, CodeType) or code in seen or not _ours(code.co_filename):
        return False
    seen.add(code)
    scope: dict[str, Any] = getattr(func, "__globals__", {})
    return any(
        _leads_to_a_process(scope[name], seen)
        for nested in _codes(code)
        for name in nested.co_names
        if name in scope
    )


def _starts_processes(item: pytest.Item) -> bool:
    if PROCESS_TIERS.intersection(item.path.resolve().relative_to(TESTS).parts):
        return True
    uses: list[Any] = [getattr(item, "function", None)]
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is not None:
        uses += [d.func for defs in fixtures.name2fixturedefs.values() for d in defs]
    seen: set[CodeType] = set()
    return any(_leads_to_a_process(use, seen) for use in uses if use is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    starting = [item for item in items if _starts_processes(item)]
    for item in starting:
        item.add_marker(pytest.mark.processes)
    if config.getoption("no_processes") and starting:
        config.hook.pytest_deselected(items=starting)
        chosen = set(map(id, starting))
        items[:] = [item for item in items if id(item) not in chosen]


# The test running in this process (under --no-processes), and what it started.
_running: list[pytest.Item] = []
_STARTED = pytest.StashKey[str]()


def _refuse_processes() -> None:
    """Make every way of starting a process fail the test that takes it (outside a test,
    as when pytest-xdist starts its workers, they work as ever)."""

    def refusing(name: str, start: Callable[..., Any]) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            if not _running:
                return start(*args, **kwargs)
            _running[0].stash[_STARTED] = name
            raise RuntimeError(f"{name}: a test run with --no-processes started a process")

        return refused

    subprocess.Popen.__init__ = refusing("subprocess.Popen", subprocess.Popen.__init__)  # type: ignore[method-assign]
    multiprocessing.util.spawnv_passfds = refusing(
        "multiprocessing", multiprocessing.util.spawnv_passfds
    )
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        setattr(os, name, refusing(f"os.{name}", getattr(os, name)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.remove(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    started = item.stash.get(_STARTED, None)
    if started is not None and call.when == "teardown":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a process ({started}), which --no-processes (`make "
            "check`) refuses: mark it @pytest.mark.processes, or have it use what leads "
            "tests/conftest.py to mark it (see `the tests that start processes` there)"
        )
    return report
