"""Connecting: the SQLAlchemy engine for a ``TETHER_DATABASE_URL``, set up per backend.

SQLite: WAL, ``synchronous=FULL``, a busy timeout, and every transaction opened with
``BEGIN IMMEDIATE`` so two writers serialise at BEGIN instead of failing at COMMIT.
PostgreSQL: psycopg 3, ``synchronous_commit=on`` (the driver is loaded by SQLAlchemy only
for a PostgreSQL URL); behind a transaction pooler (``?pool_mode=transaction``) what the
pooler allows instead (``pooling``). The database's clock is ``clock.db_now()``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tether.errors import ConfigError
from tether.store.backend.faults import name_refusals, track_commits
from tether.store.backend.pooling import connect_args, pool_mode, without_pool_mode

# The execution option of a SQLite connection that only reads (``StoreBase.reading``).
READ = "tether_read"

# The connections a store keeps open to PostgreSQL, and the threads it reaches them through.
POOL_SIZE = 20


def normalize_url(url: str) -> str:
    """Map the URLs users write (``postgresql://``) to the driver we ship (psycopg 3)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith(("postgresql+psycopg://", "sqlite:///")):
        return url
    raise ConfigError(
        f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://USER@HOST/DB"
    )


def create_db_engine(url: str) -> Engine:
    """An engine for ``url`` with its backend's connection and transaction set-up. Its
    errors never quote a statement's parameters (``hide_parameters``): they hold the content
    being written, and an error may reach a log (reference §20)."""
    url = normalize_url(url)
    try:
        parsed = sa.engine.make_url(url)
    except (ValueError, sa.exc.ArgumentError) as exc:  # never echo the URL: it may hold a password
        raise ConfigError(f"the database URL cannot be parsed ({exc}): check it") from exc
    if url.startswith("sqlite"):
        engine = _sqlite_engine(url)
    else:
        # No pre-ping: it would cost a round trip before every transaction. A pooled
        # connection that died meanwhile fails at its first statement, before any COMMIT,
        # and ``tether._runtime.hop`` tries the call again on a fresh one (the pool drops every
        # connection older than the failure). The store's threads are as many as the pool
        # keeps (``StoreBase.executor``), so calls through them never open a connection
        # beyond it: an overflow connection is closed when it is given back, and a busy
        # worker opened and closed one per step, at several ms of the server's CPU each
        # (benchmarks/capacity.py). The overflow serves callers outside those threads.
        # ``pool_mode`` is tether's, not libpq's: it says which session-level features
        # (prepared statements, startup parameters) the connections may use.
        mode = pool_mode(parsed)
        engine = sa.create_engine(
            without_pool_mode(parsed),
            pool_size=POOL_SIZE,
            max_overflow=10,
            pool_timeout=10,
            connect_args={**connect_args(mode), "connect_timeout": 5},
            hide_parameters=True,
        )
    track_commits(engine)  # a store call is retried only if nothing of it was committed
    name_refusals(engine)  # a missing database or a wrong password is not retried
    return engine


def sqlite_file(engine: Engine) -> Path | None:
    """The file of a SQLite ``engine`` (None for PostgreSQL or an in-memory database).
    Connecting creates it; only the commands that migrate may (``store.migrate``)."""
    database = engine.url.database or ""
    if engine.url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    return Path(database).expanduser().resolve()


def check_folder(engine: Engine) -> None:
    """Refuse a SQLite ``engine`` whose file's folder does not exist (``invalid_config``,
    naming it): connecting creates the file, but nothing creates a folder, so a mistyped
    path is an error rather than a new database somewhere unexpected."""
    path = sqlite_file(engine)
    if path is not None and not path.parent.is_dir():
        raise ConfigError(
            f"the folder {path.parent} of the SQLite database in TETHER_DATABASE_URL does not "
            "exist: check the path, or create the folder first"
        )


def _sqlite_engine(url: str) -> Engine:
    engine = sa.create_engine(
        url,
        connect_args={"timeout": 30.0, "check_same_thread": False},
        pool_size=10,
        hide_parameters=True,
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let us issue BEGIN ourselves (pysqlite's own transaction handling is bypassed).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    writer = _writer(engine)

    @sa.event.listens_for(engine, "checkout")
    def _on_checkout(_dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        writer.checked_out(+1)

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        if conn.get_execution_options().get(READ):
            conn.exec_driver_sql("BEGIN")  # deferred: a reader in WAL mode waits for no one
            return
        writer.enter()
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    @sa.event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, _record: Any) -> None:
        writer.checked_out(-1)

    return engine


class _Writer:
    """The lock this process's transactions on one SQLite file take before ``BEGIN
    IMMEDIATE``, held by a thread until it has given back every connection it checked out.

    SQLite lets one writer in at a time. Threads that met its lock held waited in SQLite's
    busy handler, which sleeps 1, 2, 5, 10 ... 100 ms between tries rather than waking when
    the lock frees: with a thousand runs in flight a worker left much of its CPU idle
    (benchmarks/README.md, capacity.py). On a lock of our own a thread goes in as
    soon as the one before is done; other processes still meet SQLite's lock and its
    handler. A thread that opens a second transaction while it holds the lock (another
    engine on the same file, say) goes on holding it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine = threading.local()

    def checked_out(self, change: int) -> None:
        depth = getattr(self._mine, "depth", 0) + change
        self._mine.depth = depth
        if depth <= 0 and getattr(self._mine, "held", False):
            self._mine.held = False
            self._lock.release()

    def enter(self) -> None:
        if not getattr(self._mine, "held", False):
            self._lock.acquire()
            self._mine.held = True


# One writer lock per SQLite file in this process, whichever engines open it.
_WRITERS: dict[str, _Writer] = {}
_WRITERS_GUARD = threading.Lock()


def _writer(engine: Engine) -> _Writer:
    path = str(sqlite_file(engine) or id(engine))
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(path, _Writer())
