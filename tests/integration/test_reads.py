"""Reads of the store (``StoreBase.reading``, ``snapshots``): a run's state in one round
trip on PostgreSQL whatever its length, reads that never wait for a writer, and the live
feed's round (each run after its own cursor, outside any transaction)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from store_runs import new_run

from tether.store import Store

DEADLINE_S = 10.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store(db_url)
    yield opened
    opened.close()


def _grow(store: Store, run_id: str, messages: int) -> None:
    """Append ``messages`` tool messages to the run, as its steps would have."""
    from tether.store.sql.steps import INSERT_MESSAGE

    with store.begin() as conn:
        rows = [
            {"run_id": run_id, "seq": 1 + i, "message": {"role": "tool", "content": f"m{i}"}}
            for i in range(messages)
        ]
        conn.execute(INSERT_MESSAGE, rows)


def _sent(store: Store) -> list[str]:
    """The statements ``store`` sends from now on, each with whether the driver's
    connection was in a transaction of its own making (psycopg sends BEGIN before the
    first statement of a connection that is not in autocommit)."""
    seen: list[str] = []

    def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        driver = conn.connection.dbapi_connection
        inside = "" if getattr(driver, "autocommit", False) else " in a transaction"
        seen.append(sql.lstrip().split(None, 1)[0].upper() + inside)

    sa.event.listen(store.engine, "before_cursor_execute", statement)
    return seen


@pytest.mark.parametrize("length", [3, 300])
def test_a_runs_state_is_read_in_one_statement_outside_any_transaction_on_postgresql(
    pg_url: str, length: int
) -> None:
    store = Store(pg_url)
    try:
        run_id = new_run(store)
        _grow(store, run_id, length)
        seen = _sent(store)
        snapshot = store.snapshot(run_id, history=True)
    finally:
        store.close()
    assert snapshot is not None and len(snapshot.messages) == length + 1
    assert [m["content"] for m in snapshot.messages[1:]] == [f"m{i}" for i in range(length)]
    # One statement, however long the run, in autocommit: no BEGIN, no COMMIT around it.
    assert seen == ["SELECT"], seen


def test_a_read_does_not_wait_for_a_writer_that_holds_the_database(store: Store) -> None:
    """A transaction that writes holds SQLite's file (and, in this process, the writers'
    lock) until it ends; a read of a run meanwhile goes through: it never takes either."""
    run_id = new_run(store)
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with store.begin() as conn:
            conn.execute(
                sa.text("UPDATE runs SET question = 'held' WHERE id = :id"), {"id": run_id}
            )
            holding.set()
            release.wait(DEADLINE_S)

    held = threading.Thread(target=writer)
    held.start()
    try:
        assert holding.wait(DEADLINE_S), "the writer never began"
        read: list[Any] = []
        reader = threading.Thread(target=lambda: read.append(store.snapshot(run_id)))
        reader.start()
        reader.join(DEADLINE_S)
        assert not reader.is_alive(), "the read waited for the writer"
        assert read[0] is not None and read[0].run.question == "q"  # as last committed
    finally:
        release.set()
        held.join(DEADLINE_S)


def test_a_feed_round_reads_each_run_after_its_own_cursor_outside_any_transaction(
    store: Store,
) -> None:
    """``events_of_runs``, the live feed's round: each run's events after its own cursor,
    oldest first, at most ``limit``, and the runs' states (a run gone has none); on
    PostgreSQL two statements in autocommit, whatever the number of runs."""
    from tether.store.sql.steps import add_event

    first, second = new_run(store), new_run(store)
    with store.begin() as conn:
        for i in range(3):
            add_event(conn, first, "note", {"i": i})
            add_event(conn, second, "note", {"i": i})
    ids = {run_id: [e.id for e in store.events(run_id)] for run_id in (first, second)}
    seen = _sent(store)
    cursors = {first: ids[first][1], second: 0, "gone": 0}
    states, events = store.events_of_runs(cursors, limit=100)
    assert set(states) == {first, second}
    assert [e.id for e in events] == sorted(ids[first][2:] + ids[second])
    if store.dialect.name == "postgresql":
        assert seen == ["SELECT", "SELECT"], seen
    _, oldest = store.events_of_runs(cursors, limit=2)
    assert [e.id for e in oldest] == sorted(ids[first][2:] + ids[second])[:2]
    _, one = store.events_of_runs({second: ids[second][-2]}, limit=100)  # another shape
    assert [e.id for e in one] == ids[second][-1:]
