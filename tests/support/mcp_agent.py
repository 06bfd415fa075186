"""The MCP test server as tests and ``tether`` subprocesses use it: its stdio and
streamable HTTP forms, and an agent whose tools all come from it
(``--agent mcp_agent:agent``; the server's data file is ``MCP_NOTES_DB``, the script
``MCP_SCRIPT``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import agents
import httpx
from waiting import poll_until

from tether import Agent, ScriptedModel
from tether.mcp import HttpServer, Override, StdioServer, serving

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def stdio(db: Path | str, *, prefix: str = "") -> StdioServer:
    """The test server as a subprocess of the process that connects to it."""
    return StdioServer(
        command=sys.executable, args=[SERVER, "--db", str(db), "stdio"], prefix=prefix
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1.0)
    except httpx.TransportError:
        return False
    return True


@contextmanager
def http_server(db: Path | str, log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The test server over streamable HTTP in a subprocess, once it answers: its URL and
    process (stopped after)."""
    port = free_port()
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, SERVER, "--db", str(db), "http", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        poll_until(lambda: proc.poll() is not None or _answers(url), what="the MCP server")
        assert proc.poll() is None, log.read_text()[-3000:]
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def http(url: str, *, prefix: str = "") -> HttpServer:
    return HttpServer(url=url, prefix=prefix)


def reconcile_delete(db: Path | str) -> Override:
    """``delete_note``'s override: reconciled by looking its key up in the server's data
    (what the server's operator would expose; here the test reads the file)."""
    import mcp_server

    from tether import Reconciled, ToolContext

    def find(key: str, _ctx: ToolContext) -> Reconciled:
        seen = [k for _, k in mcp_server.effects(str(db), "delete_note") if k == key]
        return Reconciled.found("deleted") if seen else Reconciled.absent()

    return {"reconcile": find}


SAFE: dict[str, Override] = {"plain_write": {"accept_unreconcilable": True}}

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # a read, then the idempotent write, then the answer: nothing to confirm.
    "add": [
        {"tool_calls": [agents.call("read_note", title="alpha")]},
        {"tool_calls": [agents.call("add_note", title="beta", body="second")]},
        {"content": "added"},
    ],
    # a read, then the destructive write a human confirms, then the answer.
    "delete": [
        {"tool_calls": [agents.call("read_note", title="alpha")]},
        {"tool_calls": [agents.call("delete_note", title="alpha")]},
        {"content": "deleted"},
    ],
}


def agent() -> Agent:
    """An agent whose tools are the test server's, over stdio."""
    db = os.environ["MCP_NOTES_DB"]
    overrides = {**SAFE, "delete_note": reconcile_delete(db)}
    return Agent(
        name="mcp-kit",
        system_prompt="You keep notes.",
        lifespan=serving(stdio(db), overrides=overrides),
        default_model=lambda: ScriptedModel(SCRIPTS[os.environ.get("MCP_SCRIPT", "add")]),
    )
