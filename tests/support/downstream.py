"""The test agent's downstream: a SQLite file of its own (``KIT_EFFECTS_DB``, set per test by
the conftest and inherited by subprocesses), shared by every process of a test.

Its ``effects`` table is what the tools did to the outside world, one row per effect with
the call's idempotency key, so a test can count external effects per key; ``world`` holds
the settings a test gives the tools (prices, holds, permissions, delays); ``failures``
holds one-shot ambiguous failures to inject into a tool's next call.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from tether import Reconciled, ToolContext
from tether.tools.tool import OutcomeUnknown


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["KIT_EFFECTS_DB"], timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, key TEXT, tool TEXT,"
        " item TEXT)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS world (name TEXT PRIMARY KEY, value TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS failures (tool TEXT PRIMARY KEY, kind TEXT)")
    return conn


def world(name: str, default: str = "") -> str:
    with _db() as conn:
        row = conn.execute("SELECT value FROM world WHERE name = ?", (name,)).fetchone()
        return str(row[0]) if row else default


def set_world(name: str, value: str) -> None:
    conn = _db()
    conn.execute("INSERT OR REPLACE INTO world (name, value) VALUES (?, ?)", (name, value))
    conn.close()


def inject_failure(tool_name: str, kind: str) -> None:
    """One-shot: the next call of ``tool_name`` commits then fails ambiguously
    (``after_commit``) or fails ambiguously without committing (``before_commit``)."""
    conn = _db()
    conn.execute("INSERT OR REPLACE INTO failures (tool, kind) VALUES (?, ?)", (tool_name, kind))
    conn.close()


def effects(key: str | None = None) -> list[tuple[str, str, str]]:
    """Effects applied downstream, optionally for one idempotency key."""
    conn = _db()
    query = "SELECT key, tool, item FROM effects"
    rows = conn.execute(
        query + (" WHERE key = ?" if key else "") + " ORDER BY id", (key,) if key else ()
    ).fetchall()
    conn.close()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def effects_reset() -> None:
    """Forget every effect (between rounds of one test)."""
    conn = _db()
    conn.execute("DELETE FROM effects")
    conn.close()


def apply(ctx: ToolContext, tool_name: str, item: str, *, dedupe: bool) -> dict[str, Any]:
    """One write downstream under ``ctx``'s idempotency key (``dedupe``: a key already
    applied answers with its first item), honouring a failure ``inject_failure`` set."""
    conn = _db()
    try:
        conn.execute("BEGIN IMMEDIATE")
        failure = conn.execute("SELECT kind FROM failures WHERE tool = ?", (tool_name,)).fetchone()
        if failure:
            conn.execute("DELETE FROM failures WHERE tool = ?", (tool_name,))
        if failure and failure[0] == "before_commit":
            conn.execute("COMMIT")
            raise OutcomeUnknown("downstream timed out")
        first = conn.execute(
            "SELECT item FROM effects WHERE key = ? ORDER BY id LIMIT 1", (ctx.idempotency_key,)
        ).fetchone()
        if not (dedupe and first):
            conn.execute(
                "INSERT INTO effects (key, tool, item) VALUES (?, ?, ?)",
                (ctx.idempotency_key, tool_name, item),
            )
        conn.execute("COMMIT")
        if failure and failure[0] == "after_commit":
            raise OutcomeUnknown("downstream answered 503 after committing")
        return {"done": tool_name, "item": first[0] if dedupe and first else item}
    finally:
        conn.close()


def write_effect(ctx: ToolContext, tool_name: str, item: str) -> dict[str, Any]:
    """Apply one write downstream for ``ctx``'s key (no deduplication); honours
    ``inject_failure`` like the test agent's own writes."""
    return apply(ctx, tool_name, item, dedupe=False)


def note_execution(key: str, tool_name: str, item: str) -> None:
    """Record that ``tool_name`` ran under ``key`` (a read's executions, to count them)."""
    conn = _db()
    try:
        conn.execute(
            "INSERT INTO effects (key, tool, item) VALUES (?, ?, ?)", (key, tool_name, item)
        )
    finally:
        conn.close()


def find(key: str, _ctx: ToolContext) -> Reconciled:
    """A reconcile by key: the first effect under ``key``, or absent."""
    found = effects(key)
    if found:
        return Reconciled.found({"done": found[0][1], "item": found[0][2]})
    return Reconciled.absent()
