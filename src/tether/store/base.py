"""What every part of the store shares: the SQLAlchemy engine and the backend's dialect."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tether.store.dialect import Dialect, dialect_for
from tether.store.engine import create_db_engine
from tether.store.migrate import ensure_schema


class StoreBase:
    """The engine for a URL and its dialect. Creating one does no I/O: connections are
    opened on first use."""

    def __init__(self, url: str, *, heartbeat_refresh_s: float = 0.0, retry_s: float = 0.0) -> None:
        self.url = url
        # How long ``tether.services.hop`` retries a call that met a transient database
        # error and committed nothing (``tether.store.faults``).
        self.retry_s = retry_s
        self.engine: Engine = create_db_engine(url)
        self.dialect: Dialect = dialect_for(self.engine)
        # A step write refreshes a heartbeat older than this (a third of the timeout).
        self.heartbeat_refresh_s = heartbeat_refresh_s

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def ping(self) -> None:
        """Readiness: one query; raises the driver's error (``sqlalchemy.exc.DBAPIError``)
        when the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(sa.select(1)).scalar_one()

    def ensure_schema(self, *, migrate_empty: bool) -> None:
        """Check the schema is current (build it in an empty database if asked)."""
        ensure_schema(self.engine, migrate_empty=migrate_empty)

    def listen_dsn(self) -> str | None:
        """The libpq DSN a ``LISTEN`` connection should use (PostgreSQL), else None."""
        return self.dialect.listen_dsn(self.engine.url)
