"""The sandbox CRM's tables, its status enums, and how its SQLite engine is opened.

One SQLite file in WAL mode with a busy timeout. pysqlite's own transaction handling is
turned off so that each transaction's BEGIN is chosen here: readers ``BEGIN DEFERRED``,
writers (through :func:`writer`) ``BEGIN IMMEDIATE``, which takes the write lock up front
so a check-then-write inside one transaction cannot race another writer.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
)
from sqlalchemy.engine import URL

BUSY_TIMEOUT_MS = 10_000
_BEGIN_OPTION = "sandbox_sqlite_begin"

metadata = MetaData()

discount_tiers = Table(
    "discount_tiers",
    metadata,
    Column("tier", String, primary_key=True),
    Column("pct", Integer, nullable=False),
)

accounts = Table(
    "accounts",
    metadata,
    Column("id", String, primary_key=True),
    Column("name", String, nullable=False),
    Column("discount_tier", String, ForeignKey("discount_tiers.tier"), nullable=False),
    Column("credit_hold", Boolean, nullable=False),
)

skus = Table(
    "skus",
    metadata,
    Column("sku", String, primary_key=True),
    Column("description", String, nullable=False),
    Column("list_price_cents", Integer, nullable=False),
)

users = Table(
    "users",
    metadata,
    Column("id", String, primary_key=True),
    Column("role", String, nullable=False),
    Column("accounts", JSON, nullable=False),  # list of account ids, in the order granted
    Column("can_draft_quotes", Boolean, nullable=False),
    Column("can_send_quotes", Boolean, nullable=False),
    Column("max_discount_pct", Integer, nullable=False),
    Column("manager", String, ForeignKey("users.id"), nullable=True),
)

quotes = Table(
    "quotes",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),  # Q-{seq}
    Column("quote_id", String, nullable=False, unique=True),
    Column("account_id", String, ForeignKey("accounts.id"), nullable=False),
    Column("lines", JSON, nullable=False),  # [{"sku", "quantity", "unit_price_cents"}]
    Column("discount_tier", String, nullable=False),
    Column("discount_pct", Integer, nullable=False),
    Column("total_cents", Integer, nullable=False),
    Column("status", String, nullable=False),
    Column("created_by", String, nullable=False),
    Column("created_key", String, nullable=False, unique=True),
    Column("created_at", String, nullable=False),
    Column("sent_by", String, nullable=True),
    Column("sent_key", String, nullable=True, unique=True),
    Column("sent_at", String, nullable=True),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", String, primary_key=True),
    Column("method_path", String, nullable=False),  # e.g. "POST /quotes/Q-1001/send"
    Column("body_hash", String, nullable=False),
    Column("user_id", String, nullable=False),
    Column("action", String, nullable=False),  # an Action value
    Column("quote_id", String, nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("response", JSON, nullable=False),
    Column("created_at", String, nullable=False),
)


class QuoteStatus(StrEnum):
    """A quote's lifecycle; the values are the stored strings."""

    DRAFT = "draft"  # created, may be re-priced and sent
    SENT = "sent"  # sent to the customer; final


class Action(StrEnum):
    """What a recorded idempotent write did; the values are the stored strings."""

    CREATED = "created"  # POST /quotes
    SENT = "sent"  # POST /quotes/{quote_id}/send


def open_engine(db_path: str) -> Engine:
    """An engine on the SQLite file at ``db_path``: WAL, busy timeout, explicit BEGINs."""
    engine = create_engine(
        URL.create("sqlite", database=db_path),
        pool_size=10,
        max_overflow=40,  # above the server's worker threads, so none waits on the pool
    )
    event.listen(engine, "connect", _on_connect)
    event.listen(engine, "begin", _on_begin)
    return engine


def _on_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own transaction handling is off so that _on_begin decides how to BEGIN
    # (SQLAlchemy's documented recipe for SQLite locking control).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _on_begin(conn: Connection) -> None:
    # Writers take the write lock at BEGIN (IMMEDIATE), so check-then-write is atomic.
    mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


def writer(engine: Engine) -> Engine:
    """A view of ``engine`` (same pool) whose transactions begin IMMEDIATE."""
    return engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
