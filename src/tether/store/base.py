"""What every part of the store shares: the SQLAlchemy engine and the backend's dialect."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tether.sealing import Keyring
from tether.store.backend import faults, pooling
from tether.store.backend.announce import Announcer, take
from tether.store.backend.connect import create_db_engine, normalize_url
from tether.store.backend.dialect import Dialect, dialect_for
from tether.store.backend.pooling import PoolMode, pool_mode
from tether.store.migrate import ensure_schema
from tether.store.sealing import check_keys
from tether.store.sql.sealed import attach

T = TypeVar("T")


class StoreBase:
    """The engine for a URL and its dialect. Creating one does no I/O: connections are
    opened on first use. ``listen_url`` is where ``LISTEN`` connects (default ``url``);
    it must be given, and reach PostgreSQL directly, when ``url`` says
    ``?pool_mode=transaction`` (``backend.pooling``)."""

    def __init__(
        self,
        url: str,
        *,
        listen_url: str | None = None,
        heartbeat_refresh_s: float = 0.0,
        retry_s: float = 0.0,
        keyring: Keyring | None = None,
    ) -> None:
        self.url = url
        # How long ``tether._runtime.hop.hop`` retries a call that met a transient database
        # error and committed nothing (``tether.store.backend.faults``).
        self.retry_s = retry_s
        self.engine: Engine = create_db_engine(url)
        # Content is sealed and opened with ``keyring`` (reference §20; None: in the clear).
        self.keyring = keyring
        attach(self.engine, keyring)
        self.dialect: Dialect = dialect_for(self.engine.dialect.name)
        given = sa.engine.make_url(normalize_url(url))
        self.pool_mode = pool_mode(given)
        # Where LISTEN connects: ``listen_url``, else ``url`` (not a transaction pooler's).
        self._listen_url = pooling.listen_url(
            given, None if listen_url is None else sa.engine.make_url(normalize_url(listen_url))
        )
        # A step write refreshes a heartbeat older than this (a third of the timeout).
        self.heartbeat_refresh_s = heartbeat_refresh_s
        self._executor: ThreadPoolExecutor | None = None
        # Tells live event streams of new events once their transaction has ended; a
        # NOTIFY is a statement of a transaction, so it goes where transactions go.
        self.announcer = Announcer(self.notify_dsn())

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction (``engine.begin()``) whose runs given events are announced to the
        live event streams when it has ended (``tether.store.backend.announce``)."""
        with self.engine.connect() as conn:
            try:
                with conn.begin():
                    yield conn
            finally:
                self.announcer.announce(take(conn))

    def settled(self, write: Callable[[Connection], T], xid: Callable[[T], int | None]) -> T:
        """``write(conn)`` in a transaction of its own, whose COMMIT, if cut off before its
        answer came (it may have landed), is settled at once where the server can tell:
        PostgreSQL is asked the transaction's fate by its id (``xid(result)``, read in the
        transaction; ``Dialect.fate``). Committed: the result stands. Aborted: the call
        failed before anything landed and may be tried again. Unknown: the caller learns
        the outcome is unknown, as of any cut-off COMMIT (``backend.faults``)."""
        done = False
        result: T
        try:
            with self.begin() as conn:
                result = write(conn)
                done = True
            return result
        except Exception as exc:
            if not (done and faults.cut_at_commit(exc)):
                raise
            known = xid(result)
            fate = None if known is None else self.dialect.fate(self.engine, known)
            if fate == "committed":
                return result
            if fate == "aborted":
                faults.not_committed()
            raise

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection for reads that write nothing: on PostgreSQL outside any transaction
        (autocommit), so a one-statement read is one round trip, without the BEGIN and the
        ROLLBACK around it; on SQLite in a deferred transaction (``READ``), which neither
        waits for a writer nor holds one up, and gives its statements one view."""
        with self.engine.connect() as conn:
            yield conn.execution_options(**self.dialect.read_options)

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The threads async callers reach the store through (``tether._runtime.hop.hop``): one per
        connection the pool keeps, so 50 concurrent approvals do not queue behind the event
        loop's default executor (min(32, cores + 4) threads, shared with every other
        ``to_thread``), and no call through them opens a connection the pool then closes.
        Threads start on first use."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=_connections(self.engine), thread_name_prefix="tether-store"
            )
        return self._executor

    def close(self) -> None:
        """Release the database connections and the store's idle threads (both come back
        on next use)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self.announcer.stop()
        self.engine.dispose()

    def ping(self) -> None:
        """Readiness: one query; raises the driver's error (``sqlalchemy.exc.DBAPIError``)
        when the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(sa.select(1)).scalar_one()

    def ensure_schema(self, *, migrate_empty: bool) -> None:
        """Check commits are durable, the schema is current (build it in an empty database
        if asked) and this process holds every key stored content is sealed with."""
        self.check_commits()
        ensure_schema(self.engine, migrate_empty=migrate_empty)
        check_keys(self.engine, self.dialect, self.keyring)

    def check_commits(self) -> None:
        """Behind a transaction pooler, refuse to run unless commits are synchronous
        (``pooling.check_commits``); direct connections ask for it themselves."""
        if self.pool_mode is PoolMode.TRANSACTION:
            pooling.check_commits(self.engine)

    def listen_dsn(self) -> str | None:
        """The libpq DSN a ``LISTEN`` connection should use (PostgreSQL), else None: the
        listen URL's, which reaches PostgreSQL without a transaction pooler."""
        return self.dialect.listen_dsn(self._listen_url)

    def notify_dsn(self) -> str | None:
        """The libpq DSN the notices are sent on (PostgreSQL), else None: the store's own,
        through its pooler if it has one."""
        return self.dialect.listen_dsn(self.engine.url)


def _connections(engine: Engine) -> int:
    """How many connections ``engine``'s pool keeps open."""
    return max(1, int(getattr(engine.pool, "size", lambda: 5)()))
