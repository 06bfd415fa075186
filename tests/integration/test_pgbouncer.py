"""The store behind a real PgBouncer in transaction mode (``tests/support/pgbouncer.py``), on
PostgreSQL only (SQLite has no pooler): what breaks without ``?pool_mode=transaction`` and
a direct LISTEN URL, and that with them the notices and the wake-ups arrive and commits
stay synchronous. Processes behind the pooler: tests/acceptance/test_behind_pgbouncer.py.
"""

from __future__ import annotations

import asyncio
from functools import partial

import inprocess
import psycopg
import pytest
import sqlalchemy as sa
from pgbouncer import pgbouncer
from waiting import until

from tether import Engine
from tether.errors import DatabaseMisconfigured
from tether.store import SchemaStatus, Store, schema_status
from tether.store.backend.connect import create_db_engine
from tether.store.backend.listen import EVENTS_CHANNEL
from tether.worker import Worker

NOTICE_DEADLINE_S = 30.0


def test_without_pool_mode_the_pooler_refuses_the_connection_and_tether_says_what_to_add(
    pg_url: str,
) -> None:
    with pgbouncer(pg_url) as bouncer:
        store = Store(bouncer.url)
        try:
            # Refused for good (never retried): the startup parameter a direct connection
            # sends to ask for synchronous commits.
            with pytest.raises(DatabaseMisconfigured, match=r"add \?pool_mode=transaction"):
                store.ping()
        finally:
            store.close()
        assert "unsupported startup parameter: options" in bouncer.log_tail()


def _alternate(engine: sa.Engine, rounds: int) -> int:
    """Run one statement ``rounds`` times on each of two connections in turn, each in a
    transaction of its own (so the pooler lends its server connection in between)."""
    ran = 0
    with engine.connect() as first, engine.connect() as second:
        for n in range(rounds):
            for conn in (first, second):
                assert conn.execute(sa.text("SELECT CAST(:n AS integer)"), {"n": n}).scalar() == n
                conn.commit()
                ran += 1
    return ran


def test_prepared_statements_break_through_the_pooler_unless_the_url_says_pool_mode(
    pg_url: str,
) -> None:
    # One server connection for both clients, and the startup parameter let through, as
    # a team that only added ``ignore_startup_parameters = options`` would have it.
    with pgbouncer(pg_url, pool_size=1, ignore_startup_parameters="options") as bouncer:
        plain = create_db_engine(bouncer.url)
        try:
            # psycopg prepares the statement on its sixth run, as "_pg3_0", on the server
            # connection it then has; the other client prepares its own "_pg3_0" there.
            with pytest.raises(sa.exc.ProgrammingError, match='prepared statement "_pg3_0"'):
                _alternate(plain, rounds=10)
        finally:
            plain.dispose()
        pooled = create_db_engine(bouncer.tether_url)
        try:
            assert _alternate(pooled, rounds=10) == 20
        finally:
            pooled.dispose()


def test_a_listen_through_the_pooler_hears_nothing_and_its_notices_reach_another_client(
    pg_url: str,
) -> None:
    """Why LISTEN needs a direct connection: the LISTEN stays on the server connection it
    ran on, and a notice is delivered to whichever client holds that connection then."""
    with (
        pgbouncer(pg_url, pool_size=1) as bouncer,
        psycopg.connect(bouncer.url, autocommit=True) as listener,
        psycopg.connect(bouncer.url, autocommit=True, prepare_threshold=None) as sender,
    ):
        listener.execute("LISTEN tether_runs")
        received: list[psycopg.Notify] = []
        sender.add_notify_handler(received.append)
        sender.execute("SELECT pg_notify('tether_runs', 'a run is ready')")
        # The sender ran on the listening server connection: the notice came back to it.
        assert [(n.channel, n.payload) for n in received] == [("tether_runs", "a run is ready")]
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


def test_notices_sent_through_the_pooler_reach_a_listener_on_the_direct_url(pg_url: str) -> None:
    with (
        pgbouncer(pg_url) as bouncer,
        psycopg.connect(pg_url, autocommit=True) as listener,
    ):
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        store = Store(bouncer.tether_url, listen_url=pg_url)
        try:
            assert f":{bouncer.port}/" in (store.notify_dsn() or "")
            assert store.listen_dsn() == pg_url
            before = bouncer.transactions()
            store.announcer.announce({"run-1"})
            heard = list(listener.notifies(timeout=NOTICE_DEADLINE_S, stop_after=1))
            assert [(n.channel, n.payload) for n in heard] == [(EVENTS_CHANNEL, "run-1")]
            assert bouncer.transactions() > before  # it was sent through the pooler
        finally:
            store.close()


async def _answered(engine: Engine, run_id: str) -> bool:
    run = (await engine.get_run(run_id)).run
    return run is not None and run.state.value == "answered"


async def test_an_idle_worker_behind_the_pooler_is_woken_by_notify_on_its_direct_listen(
    pg_url: str,
) -> None:
    with pgbouncer(pg_url) as bouncer:
        engine = inprocess.engine(
            bouncer.tether_url, script_name="answer", listen_database_url=pg_url
        )
        worker = Worker(engine, concurrency=2, poll_s=3600)  # only a NOTIFY can wake it
        running = asyncio.create_task(worker.run(reap=False))
        try:
            # One run per wake-up, so each answered run proves a NOTIFY arrived (the first
            # may come before the listener connects: connecting wakes the loop too).
            for i in range(3):
                run = await engine.start_run("dana", f"wake {i}")
                await until(partial(_answered, engine, run.id), what="the worker woken")
        finally:
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
            engine.close()
        assert worker.restarts["listener"] == 0
        assert await asyncio.to_thread(bouncer.transactions) > 0


@pytest.mark.parametrize("empty_url", ["postgresql"], indirect=True)
def test_behind_the_pooler_tether_refuses_to_run_where_commits_would_not_be_synchronous(
    empty_url: str,
) -> None:
    database = sa.engine.make_url(empty_url).database
    with psycopg.connect(empty_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    with pgbouncer(empty_url) as bouncer:
        pooled = Store(bouncer.tether_url, listen_url=empty_url)
        try:
            with pytest.raises(DatabaseMisconfigured, match="synchronous_commit is 'off'"):
                pooled.ensure_schema(migrate_empty=True)
            assert schema_status(pooled.engine) is SchemaStatus.EMPTY  # nothing was built
        finally:
            pooled.close()
    # A direct connection asks for synchronous commits itself, whatever the default.
    direct = Store(empty_url)
    try:
        direct.ensure_schema(migrate_empty=True)
        with direct.engine.connect() as conn:
            assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == "on"
    finally:
        direct.close()
