"""Announcing new events to the live event streams (reference §11) on PostgreSQL, off the
writers' commits.

A ``NOTIFY`` inside a transaction makes its commit take PostgreSQL's one notification lock,
held until the commit is durable: every notifying commit of the cluster then waits for the
one before it, and concurrent step writes lose their group commit (a trigger notifying
on each event cost the workers a large part of their throughput: benchmarks/README.md,
watchers.py). So a transaction that adds events only marks its runs on its connection
(``mark``); when the transaction has ended, the store hands them to the ``Announcer``, whose
thread sends them, batched every ``BATCH_S``, as ``pg_notify`` on ``listen.EVENTS_CHANNEL``,
on a connection of its own. A notice is a hint to read again: one for a transaction that
rolled back, or a duplicate, costs a watcher one read; one lost (the announcer's connection
failed) is covered by the watchers' fallback re-read.

The same thread carries the model's text to watchers in other processes (reference §16,
``tether._runtime.live.deltas``): a ``source`` added with ``add_source`` is asked, at each
batch, for the notices it has ready (channel and payload), and ``poke`` says it has some;
``flush`` sends a batch at once and says when it is committed (a step's last text goes
out before its turn is stored).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from tether.store.backend.listen import EVENTS_CHANNEL

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

BATCH_S = 0.01  # how long the announcer gathers marks before it sends them
# How soon a ``flush`` is sent: the flushes of this long (each step's end of the runs
# watched elsewhere) share a batch rather than cut one short each.
FLUSH_S = 0.005
_KEY = "tether.announce"
# Notices in the order given, in one transaction (so one commit however many).
_SEND = "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS t(c, p)"

# What a source hands over at each batch: (channel, payload) pairs, in order.
Source = Callable[[], list[tuple[str, str]]]


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

    def __init__(self, dsn: str | None, *, batch_s: float = BATCH_S) -> None:
        self._dsn = dsn
        self._batch_s = batch_s
        self._pending: set[str] = set()
        self._sources: list[Source] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._hurry = threading.Event()  # a flush: gather no longer than ``FLUSH_S``
        self._stop = threading.Event()
        self._flushes: list[Future[None]] = []  # resolved once the next batch is sent
        self._thread: threading.Thread | None = None

    def announce(self, run_ids: set[str]) -> None:
        """Queue ``run_ids``' notices (sent within about the batch's time)."""
        if self._dsn is None or not run_ids:
            return
        with self._lock:
            self._pending |= run_ids
        self.poke()

    def add_source(self, source: Source) -> None:
        """Ask ``source`` for its notices at every batch from now on."""
        with self._lock:
            self._sources.append(source)

    def poke(self) -> None:
        """Send a batch soon (within about the batch's time): a source has notices ready."""
        if self._dsn is None:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                thread = threading.Thread(
                    target=self._run, args=(self._dsn,), name="tether-announce", daemon=True
                )
                thread.start()  # before it is seen: ``stop`` (any thread) joins only started ones
                self._thread = thread
        self._wake.set()

    def flush(self) -> Future[None]:
        """Send a batch within ``FLUSH_S``; the future is done once every notice its sources
        held when asked is committed (or failed: those are dropped, as ever). Done at once
        on SQLite."""
        done: Future[None] = Future()
        if self._dsn is None:
            done.set_result(None)
            return done
        with self._lock:
            self._flushes.append(done)
        self._hurry.set()
        self.poke()
        return done

    def stop(self) -> None:
        """Send what is queued and end the thread (the next ``announce`` starts one)."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._hurry.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self, dsn: str) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self._stop.is_set():
                if self._wake.wait(timeout=1.0):
                    self._gather()
                    self._wake.clear()
                    conn = self._flush(dsn, conn)
            conn = self._flush(dsn, conn)  # what was queued when stopped (then closed below)
        finally:
            if conn is not None:
                conn.close()
            with self._lock:
                flushes, self._flushes = self._flushes, []
            resolve(flushes)  # asked as it stopped: nothing is left to send

    def _gather(self) -> None:
        """Wait while the marks of a burst come: ``batch_s``, or ``FLUSH_S`` from a flush."""
        end = time.monotonic() + self._batch_s
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            if self._hurry.wait(left):
                self._hurry.clear()
                end = min(end, time.monotonic() + FLUSH_S)

    def _flush(
        self, dsn: str, conn: psycopg.Connection[Any] | None
    ) -> psycopg.Connection[Any] | None:
        """Send the queued notices in one statement; a failure drops them (the watchers
        re-read on their fallback) and the connection, which the next batch opens again.
        psycopg is imported here: only a store with a DSN (PostgreSQL) gets this far."""
        import psycopg

        with self._lock:
            runs, self._pending = self._pending, set()
            sources = list(self._sources)
            flushes, self._flushes = self._flushes, []  # asked before the sources are
        try:
            batch = [notice for source in sources for notice in source()]
            batch += [(EVENTS_CHANNEL, run_id) for run_id in sorted(runs)]
            if not batch:
                return conn
            try:
                if conn is None or conn.closed:
                    # Never prepared on the server: the notices may go through a transaction
                    # pooler (``pooling``), and one statement per batch parses cheaply.
                    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
                conn.execute(_SEND, ([c for c, _ in batch], [p for _, p in batch]))
                return conn
            except psycopg.Error as exc:
                log.warning("event notices not sent: %s", exc, extra={"action": "announce_failed"})
                if conn is not None:
                    conn.close()
                return None
        finally:
            resolve(flushes)


def resolve(waiting: list[Future[None]]) -> None:
    """Mark each of ``waiting`` done (from any thread); one whose waiter gave up is left."""
    for done in waiting:
        with contextlib.suppress(InvalidStateError):  # its waiter gave up (cancelled)
            done.set_result(None)
