"""The store: the engine by URL (``connect``), the schema, migrations and every database
operation (``Store``), written once and sent through the backend's dialect (``dialect``:
``sqlite.SqliteDialect``, ``postgres.PostgresDialect``)."""

from __future__ import annotations

from tether.store.compactions import CompactionRecord
from tether.store.migrate import SchemaStatus, ensure_schema, schema_status, upgrade
from tether.store.rates import Grant
from tether.store.reads import Snapshot
from tether.store.records import CallStatus, Decision, Event, LedgerEntry
from tether.store.steps import Intent, idempotency_key
from tether.store.store import Store
from tether.store.suspensions import TokenMatch

__all__ = [
    "CallStatus",
    "CompactionRecord",
    "Decision",
    "Event",
    "Grant",
    "Intent",
    "LedgerEntry",
    "SchemaStatus",
    "Snapshot",
    "Store",
    "TokenMatch",
    "ensure_schema",
    "idempotency_key",
    "schema_status",
    "upgrade",
]
