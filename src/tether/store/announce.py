"""Announcing new events to the live event streams (reference §11) on PostgreSQL, off the
writers' commits.

A ``NOTIFY`` inside a transaction makes its commit take PostgreSQL's one notification lock,
held until the commit is durable: every notifying commit of the cluster then waits for the
one before it, and concurrent step writes lose their group commit (measured with
``benchmarks/watchers.py``: a trigger notifying on each event cost the workers about 30% of
their throughput). So a transaction that adds events only marks its runs on its connection
(``mark``); when the transaction has ended, the store hands them to the ``Announcer``, whose
thread sends them, batched every ``BATCH_S``, as ``pg_notify`` on ``listen.EVENTS_CHANNEL``,
on a connection of its own. A notice is a hint to read again: one for a transaction that
rolled back, or a duplicate, costs a watcher one read; one lost (the announcer's connection
failed) is covered by the watchers' fallback re-read.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from tether.store.listen import EVENTS_CHANNEL

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

BATCH_S = 0.01  # how long the announcer gathers marks before it sends them
_KEY = "tether.announce"
_SEND = "SELECT pg_notify(%s, run_id) FROM unnest(%s::text[]) AS run_id"


def mark(conn: Connection, *run_ids: str) -> None:
    """Note that this transaction gave ``run_ids`` events (announced once it ends)."""
    marked: set[str] = conn.info.setdefault(_KEY, set())
    marked.update(run_ids)


def take(conn: Connection) -> set[str]:
    """The runs marked on ``conn`` since the last take (its transaction has ended)."""
    marked: set[str] = conn.info.pop(_KEY, set())
    return marked


class Announcer:
    """Sends the marked runs' notices from a thread of its own (started on first use);
    ``dsn`` None (SQLite, where streams poll) sends nothing."""

    def __init__(self, dsn: str | None) -> None:
        self._dsn = dsn
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def announce(self, run_ids: set[str]) -> None:
        """Queue ``run_ids``' notices (sent within about ``BATCH_S``)."""
        if self._dsn is None or not run_ids:
            return
        with self._lock:
            self._pending |= run_ids
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, args=(self._dsn,), name="tether-announce", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """Send what is queued and end the thread (the next ``announce`` starts one)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self, dsn: str) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self._stop.is_set():
                if self._wake.wait(timeout=1.0):
                    self._stop.wait(BATCH_S)  # gather the marks of a burst
                    self._wake.clear()
                    conn = self._flush(dsn, conn)
            conn = self._flush(dsn, conn)  # what was queued when stopped (then closed below)
        finally:
            if conn is not None:
                conn.close()

    def _flush(
        self, dsn: str, conn: psycopg.Connection[Any] | None
    ) -> psycopg.Connection[Any] | None:
        """Send the queued notices in one statement; a failure drops them (the watchers
        re-read on their fallback) and the connection, which the next batch opens again.
        psycopg is imported here: only a store with a DSN (PostgreSQL) gets this far."""
        import psycopg

        with self._lock:
            batch, self._pending = self._pending, set()
        if not batch:
            return conn
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True)
            conn.execute(_SEND, (EVENTS_CHANNEL, sorted(batch)))
            return conn
        except psycopg.Error as exc:
            log.warning("event notices not sent: %s", exc, extra={"action": "announce_failed"})
            if conn is not None:
                conn.close()
            return None
