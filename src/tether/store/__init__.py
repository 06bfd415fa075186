"""The store: every database operation (``Store``, one part per noun), the migrations
(``migrate``), the statements and the schema (``sql``), written once and sent through the
backend's dialect (``backend``: the engine by URL, ``sqlite.SqliteDialect``,
``postgres.PostgresDialect``). This module only re-exports."""

from __future__ import annotations

from tether.store.compaction import CompactionRecord
from tether.store.migrate import SchemaStatus, ensure_schema, schema_status, upgrade
from tether.store.model_rate import Grant
from tether.store.reads import Snapshot
from tether.store.records import CallStatus, Decision, Event, LedgerEntry
from tether.store.steps import Intent, idempotency_key
from tether.store.store import Store
from tether.store.suspensions import TokenMatch
from tether.store.trees import StepRefused

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
    "StepRefused",
    "Store",
    "TokenMatch",
    "ensure_schema",
    "idempotency_key",
    "schema_status",
    "upgrade",
]
