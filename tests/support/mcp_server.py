"""A real MCP server for the tests of ``tether.mcp``, written with the official SDK.

Its notes live in a SQLite file (``--db PATH``) that the tests read too, and every
``tools/call`` it receives is recorded there with the ``_meta`` idempotency key it
carried, so a test can count exactly what reached the server. Run it as
``python mcp_server.py --db PATH stdio`` or ``... --db PATH http --port N``.

Tools: ``read_note`` (readOnlyHint), ``delete_note`` (a destructive write: needs
confirmation), ``add_note`` (idempotentHint: a repeated key answers the first result),
``plain_write`` (no annotations at all: the MCP defaults; ``die`` exits mid-call).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

KEY = "tether/idempotency_key"


def connect(db: str) -> sqlite3.Connection:
    """The server's data; shared with the tests, so WAL and a generous busy timeout."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS notes (title TEXT PRIMARY KEY, body TEXT)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, tool TEXT, key TEXT,"
        " arguments TEXT, authorization TEXT)"
    )
    conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, tool TEXT, key TEXT,"
        " result TEXT)"
    )
    return conn


def calls(db: str, tool: str | None = None) -> list[tuple[str, str | None, dict[str, Any]]]:
    """Every ``tools/call`` the server received (optionally of one tool), in order."""
    conn = connect(db)
    try:
        rows = conn.execute("SELECT tool, key, arguments FROM calls ORDER BY id").fetchall()
    finally:
        conn.close()
    return [(t, k, json.loads(a)) for t, k, a in rows if tool is None or t == tool]


def authorizations(db: str) -> list[str | None]:
    """The ``Authorization`` header of each call (None over stdio, or when not sent)."""
    conn = connect(db)
    try:
        rows = conn.execute("SELECT authorization FROM calls ORDER BY id").fetchall()
    finally:
        conn.close()
    return [a for (a,) in rows]


def effects(db: str, tool: str | None = None) -> list[tuple[str, str | None]]:
    """The effects the server applied: (tool, key), in order."""
    conn = connect(db)
    try:
        rows = conn.execute("SELECT tool, key FROM effects ORDER BY id").fetchall()
    finally:
        conn.close()
    return [(t, k) for t, k in rows if tool is None or t == tool]


def seed(db: str, notes: dict[str, str]) -> None:
    conn = connect(db)
    try:
        conn.executemany("INSERT OR REPLACE INTO notes VALUES (?, ?)", list(notes.items()))
    finally:
        conn.close()


def build(db: str) -> MCPServer:
    """The server, its tools writing to ``db``."""
    server = MCPServer("tether-test-notes", log_level="WARNING")

    def received(ctx: Context, tool: str, arguments: dict[str, Any]) -> str | None:
        meta = ctx.request_context.meta or {}
        key = meta.get(KEY)
        authorization = (ctx.headers or {}).get("authorization")
        conn = connect(db)
        try:
            conn.execute(
                "INSERT INTO calls (tool, key, arguments, authorization) VALUES (?, ?, ?, ?)",
                (tool, key, json.dumps(arguments, sort_keys=True), authorization),
            )
        finally:
            conn.close()
        return None if key is None else str(key)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_note(title: str, ctx: Context) -> dict[str, Any]:
        """Read a note by its title."""
        received(ctx, "read_note", {"title": title})
        conn = connect(db)
        try:
            row = conn.execute("SELECT body FROM notes WHERE title = ?", (title,)).fetchone()
        finally:
            conn.close()
        if row is None:
            raise ToolError(f"there is no note {title!r}")
        return {"title": title, "body": row[0]}

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def delete_note(title: str, ctx: Context) -> str:
        """Delete a note (destructive: a human confirms it)."""
        key = received(ctx, "delete_note", {"title": title})
        conn = connect(db)
        try:
            conn.execute("BEGIN IMMEDIATE")
            gone = conn.execute("DELETE FROM notes WHERE title = ?", (title,)).rowcount
            conn.execute(
                "INSERT INTO effects (tool, key, result) VALUES ('delete_note', ?, ?)",
                (key, str(gone)),
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
        return f"deleted {gone} note(s) titled {title}"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
    def add_note(title: str, body: str, ctx: Context) -> dict[str, Any]:
        """Add a note; a call repeated with the same idempotency key answers the first."""
        key = received(ctx, "add_note", {"title": title, "body": body})
        conn = connect(db)
        try:
            conn.execute("BEGIN IMMEDIATE")
            first = conn.execute(
                "SELECT result FROM effects WHERE tool = 'add_note' AND key = ?", (key,)
            ).fetchone()
            if first is not None and key is not None:
                conn.execute("COMMIT")
                return dict(json.loads(first[0]))
            count = conn.execute("SELECT count(*) FROM notes").fetchone()[0]
            result = {"title": title, "notes": count + 1}
            conn.execute("INSERT OR REPLACE INTO notes VALUES (?, ?)", (title, body))
            conn.execute(
                "INSERT INTO effects (tool, key, result) VALUES ('add_note', ?, ?)",
                (key, json.dumps(result)),
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
        return result

    @server.tool()
    def plain_write(text: str, ctx: Context) -> str:
        """A tool without annotations: MCP's defaults (a destructive, non-idempotent write).
        ``die`` makes the server exit mid-call, as a crashing server would."""
        received(ctx, "plain_write", {"text": text})
        if text == "die":
            os._exit(3)
        return text

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    options = parser.parse_args()
    server = build(options.db)
    connect(options.db).close()
    if options.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.port)


if __name__ == "__main__":
    main()
