"""Behind a transaction pooler (``?pool_mode=transaction``, ``tether.store.backend.pooling``): what
the store's connections ask for, where LISTEN goes, and the settings it refuses, all
without connecting (a store opens connections on first use; a connection's arguments are
caught as the driver would get them). The pooler itself is exercised in
tests/integration/test_pgbouncer.py and tests/acceptance/test_behind_pgbouncer.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from tether import Agent
from tether.config import Settings
from tether.engine import Engine
from tether.errors import ConfigError
from tether.models.scripted import ScriptedModel
from tether.store import Store
from tether.store.backend.connect import create_db_engine
from tether.store.backend.faults import refusal
from tether.store.backend.pooling import PoolMode, pool_mode

DIRECT = "postgresql://tether@db.internal:5432/tether"
POOLED = "postgresql://tether@bouncer.internal:6432/tether?pool_mode=transaction"


class _Caught(Exception):
    """Stops a connection attempt once its arguments are known."""


def connect_params(url: str) -> dict[str, Any]:
    """The keyword arguments the driver would be called with for ``url``."""
    engine = create_db_engine(url)
    seen: dict[str, Any] = {}

    @sa.event.listens_for(engine, "do_connect")
    def _catch(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
        seen.update(params)
        raise _Caught

    try:
        with pytest.raises(_Caught), engine.connect():
            pass
    finally:
        engine.dispose()
    return seen


@contextmanager
def store(url: str, listen_url: str | None = None) -> Iterator[Store]:
    opened = Store(url, listen_url=listen_url)
    try:
        yield opened
    finally:
        opened.close()


def test_a_direct_connection_asks_for_synchronous_commits_and_may_prepare() -> None:
    params = connect_params(DIRECT)
    assert params["options"] == "-c synchronous_commit=on"
    assert "prepare_threshold" not in params  # psycopg's default: prepared after 5 runs


def test_behind_a_transaction_pooler_nothing_outlives_a_transaction() -> None:
    params = connect_params(POOLED)
    assert params["prepare_threshold"] is None  # never prepared on a server connection
    assert "options" not in params  # PgBouncer refuses unknown startup parameters
    assert "pool_mode" not in params  # tether's parameter, which libpq would refuse
    assert (params["host"], params["port"]) == ("bouncer.internal", 6432)


@pytest.mark.parametrize(
    ("url", "mode"),
    [
        (DIRECT, PoolMode.SESSION),
        (f"{DIRECT}?pool_mode=session", PoolMode.SESSION),
        (POOLED, PoolMode.TRANSACTION),
    ],
)
def test_the_pool_mode_is_read_from_the_url(url: str, mode: PoolMode) -> None:
    assert pool_mode(sa.engine.make_url(url)) is mode


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"{DIRECT}?pool_mode=statement", "several statements"),
        (f"{DIRECT}?pool_mode=transactions", "must be 'transaction' or 'session'"),
        ("sqlite:///./x.db?pool_mode=transaction", "postgresql:// database URL only"),
    ],
)
def test_a_pool_mode_tether_cannot_run_behind_is_refused_at_start(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Store(url, listen_url=DIRECT)


def test_a_transaction_pooler_without_a_listen_url_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="TETHER_LISTEN_DATABASE_URL"):
        Store(POOLED)


@pytest.mark.parametrize(
    ("url", "listen_url", "says"),
    [
        (POOLED, POOLED, "directly"),
        (POOLED, "sqlite:///./x.db", "postgresql://"),
        ("sqlite:///./x.db", DIRECT, "postgresql://"),
    ],
)
def test_a_listen_url_that_cannot_listen_is_refused_at_start(
    url: str, listen_url: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        Store(url, listen_url=listen_url)


def test_behind_a_pooler_listen_goes_direct_and_notices_go_through_the_pooler() -> None:
    with store(POOLED, listen_url=DIRECT) as pooled:
        assert pooled.listen_dsn() == DIRECT
        assert pooled.notify_dsn() == "postgresql://tether@bouncer.internal:6432/tether"


def test_without_a_listen_url_a_store_listens_and_notifies_on_its_own_url() -> None:
    with store(DIRECT) as direct:
        assert direct.listen_dsn() == direct.notify_dsn() == DIRECT
    with store("sqlite:///./x.db") as embedded:
        assert embedded.listen_dsn() is embedded.notify_dsn() is None


def test_settings_read_the_listen_url_and_the_engine_hands_it_to_its_store() -> None:
    settings = Settings.from_env(
        {"TETHER_DATABASE_URL": POOLED, "TETHER_LISTEN_DATABASE_URL": DIRECT}
    )
    assert settings.listen_database_url == DIRECT
    assert Settings.from_env({}).listen_database_url is None
    agent = Agent(name="a", system_prompt="")
    engine = Engine(agent=agent, model=ScriptedModel([]), settings=settings)
    try:
        assert engine.runner.store.listen_dsn() == DIRECT
    finally:
        engine.close()


def test_a_pooler_refusing_the_startup_parameter_is_named_with_what_to_add() -> None:
    import psycopg

    refused = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 6432 failed: '
        "FATAL:  unsupported startup parameter: options"
    )
    said = refusal(refused)
    assert said is not None and "?pool_mode=transaction" in said
