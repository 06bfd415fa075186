"""Test kit: a test agent whose tools write to their own downstream table (so tests can
count external effects per idempotency key), scripts, a webhook receiver, subprocess
helpers and polls with deadlines. Imported by tests and by the worker subprocesses
(``--agent kit:agent``)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tether import Agent, Engine, GuardResult, Reconciled, Scope, ScriptedModel, ToolContext, tool
from tether.config import Settings
from tether.notify import MemoryNotifier, Notifier

__all__ = ["MemoryNotifier"]
from tether.models.base import Message, Model, ModelResponse, ToolSpec
from tether.tools.tool import OutcomeUnknown

ROOT = Path(__file__).resolve().parents[2]

# reference §8's send preview, written out (not imported from the agent) so that a change to
# the agent cannot hide in the tests.
PREVIEW_KEYS = {
    "quote_id",
    "account_id",
    "account_name",
    "lines",
    "discount_tier",
    "discount_pct",
    "total",
}
PYTHON = sys.executable

# -- the downstream: its own SQLite file, shared by every process of a test -----------------


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


def _apply(ctx: ToolContext, tool_name: str, item: str, *, dedupe: bool) -> dict[str, Any]:
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


def _find(key: str, _ctx: ToolContext) -> Reconciled:
    found = effects(key)
    if found:
        return Reconciled.found({"done": found[0][1], "item": found[0][2]})
    return Reconciled.absent()


@tool
def lookup(query: str) -> dict[str, Any]:
    """Look something up (a read); ``lookup_ms`` in the world makes it take that long."""
    work_ms = int(world("lookup_ms", "0"))
    if work_ms:
        # Marks, outside the downstream's database, that the work has begun: a test may
        # stop the process from here on without catching it inside a SQLite lock.
        Path(os.environ["KIT_EFFECTS_DB"] + ".working").touch()
        time.sleep(work_ms / 1000)  # simulated work, so elapsed-time budgets are exercised
    return {"query": query, "answer": f"about {query}", "pad": "x" * int(world("pad", "0"))}


@tool(effect="write", dedupes=True)
def record(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Record an item downstream; the downstream deduplicates by idempotency key."""
    return _apply(ctx, "record", item, dedupe=True)


@tool(effect="write", reconcile=_find)
def write_once(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Write downstream without deduplication; reconciled by looking the key up."""
    return _apply(ctx, "write_once", item, dedupe=False)


@tool(effect="write", accept_unreconcilable=True)
def blind_write(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write that can be neither reconciled nor re-issued."""
    return _apply(ctx, "blind_write", item, dedupe=False)


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"item": args.item, "price": world("price", "100")}


def _guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    if world("hold") == "1":
        return GuardResult.refuse("the account is on hold")
    return GuardResult.allow()


def _permitted(args: Any, scope: Scope) -> bool:
    return bool(scope.permissions.get("can_send", True))


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    reconcile=_find,
    preview=_preview,
    guard=_guard,
    permitted=_permitted,
)
def send(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Send an item: a write a human must confirm."""
    return _apply(ctx, "send", item, dedupe=True)


async def resolve(user_id: str) -> Scope:
    """Scope from the downstream's world table: ``perm:USER`` = "0" revokes sending."""
    return Scope(
        user_id=user_id,
        permissions={"can_send": world(f"perm:{user_id}", "1") == "1"},
        approvers=frozenset({"boss"}),
    )


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # read; a deduplicating write with a read in the same turn; a confirmed send; answer.
    "standard": [
        {"tool_calls": [call("lookup", query="x")]},
        {"tool_calls": [call("record", item="a"), call("lookup", query="y")]},
        {"tool_calls": [call("send", item="b")]},
        {"content": "done"},
    ],
    "write_once": [
        {"tool_calls": [call("write_once", item="w")]},
        {"content": "done"},
    ],
    "blind": [
        {"tool_calls": [call("blind_write", item="z")]},
        {"content": "done"},
    ],
    "send": [
        {"tool_calls": [call("send", item="b")]},
        {"content": "done"},
    ],
    "answer": [{"content": "forty-two"}],
    # no confirmation: a read, a deduplicating write, an answer.
    "work": [
        {"tool_calls": [call("lookup", query="x")]},
        {"tool_calls": [call("record", item="a")]},
        {"content": "done"},
    ],
}


def script(name: str | None = None) -> ScriptedModel:
    return ScriptedModel(SCRIPTS[name or os.environ.get("KIT_SCRIPT", "standard")])


def agent() -> Agent:
    """The test agent; its scripted model is chosen by ``KIT_SCRIPT``."""
    return Agent(
        name="kit",
        system_prompt="You are a test agent.",
        tools=(lookup, record, write_once, blind_write, send),
        resolve_scope=resolve,
        default_model=script,
    )


def engine(
    url: str,
    *,
    script_name: str = "standard",
    turns: list[dict[str, Any]] | None = None,
    notifier: Notifier | None = None,
    **settings: Any,
) -> Engine:
    """An in-process engine on ``url`` for the test agent. Unless told otherwise, a
    notice's delivery window is the heartbeat timeout (a lost one is re-issued as soon
    as the suspension is stale)."""
    if "heartbeat_timeout_s" in settings:
        settings.setdefault("notice_timeout_s", settings["heartbeat_timeout_s"])
    model = ScriptedModel(turns) if turns is not None else script(script_name)
    return Engine(
        agent=agent(),
        model=model,
        settings=Settings(database_url=url, **settings),
        notifier=notifier or MemoryNotifier(),
    )


def count_calls(engine: Engine, name: str) -> list[dict[str, Any]]:
    """Record the keyword arguments of each call of the store's method ``name`` (the
    calls still go through)."""
    seen: list[dict[str, Any]] = []
    method: Callable[..., Any] = getattr(engine._store, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return method(*args, **kwargs)

    setattr(engine._store, name, counted)
    return seen


# -- subprocesses, webhooks -------------------------------------------------------------------


def tether_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(
        {
            "TETHER_DATABASE_URL": url,
            "PYTHONPATH": str(ROOT / "tests" / "support"),
            "TETHER_HEARTBEAT_TIMEOUT_S": "0.3",
            # A lost notice is re-issued once both this and the heartbeat timeout passed.
            "TETHER_NOTICE_TIMEOUT_S": "0.3",
            "TETHER_REAPER_INTERVAL_S": "3600",
        }
    )
    env.update(extra)
    return env


def spawn(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """Start the ``tether`` CLI with the test agent in a new process; its output goes to
    ``log`` (a file, so a chatty long-running process never blocks on a full pipe)."""
    with log.open("a") as sink:
        return subprocess.Popen(
            [PYTHON, "-m", "tether", *args, "--agent", "kit:agent"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )


def tether(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the ``tether`` CLI in a new process with the test agent."""
    return subprocess.run(
        [PYTHON, "-m", "tether", *args, "--agent", "kit:agent"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


class NoticeReceiver:
    """A local webhook receiver: collects the suspension notices tether POSTs."""

    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        received = self.notices

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notices"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> NoticeReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def token_for(self, run_id: str) -> str:
        for notice in reversed(self.notices):
            if notice["run_id"] == run_id:
                return str(notice["token"])
        raise LookupError(run_id)


@contextmanager
def receiver() -> Iterator[NoticeReceiver]:
    with NoticeReceiver() as r:
        yield r


# -- fault trials (tests/acceptance/test_faults.py) ------------------------------------------


@tool
def nap(ctx: ToolContext, ms: int) -> dict[str, Any]:
    """A read that takes ``ms`` milliseconds in a plain function (so it runs in a thread);
    each execution is recorded downstream first, so a test can count how often it ran."""
    conn = _db()
    try:
        conn.execute(
            "INSERT INTO effects (key, tool, item) VALUES (?, 'nap', ?)",
            (ctx.idempotency_key, str(ms)),
        )
    finally:
        conn.close()
    time.sleep(ms / 1000)  # the slow work itself
    return {"slept_ms": ms}


async def _careful_guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    """``send``'s guard, slow (``careful_guard_ms`` in the world) when it re-checks a call
    a human approved: an approval whose re-checks outlast the heartbeat timeout."""
    if ctx.confirmed:
        await asyncio.sleep(int(world("careful_guard_ms", "0")) / 1000)
    return _guard(args, scope, ctx)


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    reconcile=_find,
    preview=_preview,
    guard=_careful_guard,
    permitted=_permitted,
)
def careful_send(ctx: ToolContext, item: str) -> dict[str, Any]:
    """``send`` with a slow re-check after approval."""
    return _apply(ctx, "careful_send", item, dedupe=True)


def _naps(count: int, ms: int) -> list[dict[str, Any]]:
    return [{"tool_calls": [call("nap", ms=ms)]} for _ in range(count)]


FAULT_SCRIPTS: dict[str, list[dict[str, Any]]] = {
    **SCRIPTS,
    # several steps, each a short nap, then a deduplicating write and the answer: a run
    # that is in progress for a few seconds.
    "steps": [*_naps(6, 300), {"tool_calls": [call("record", item="s")]}, {"content": "done"}],
    # one plain-function read far longer than the trials' heartbeat timeouts.
    "slow": [*_naps(1, 6000), {"content": "done"}],
    "careful_send": [{"tool_calls": [call("careful_send", item="c")]}, {"content": "done"}],
}


class ByQuestion(Model):
    """Plays the script the run's question names (``"script:NAME ..."``, else
    ``KIT_SCRIPT``), so one process can carry runs of different scripts."""

    name = "scripted:by-question"

    def __init__(self) -> None:
        self._models: dict[str, ScriptedModel] = {}

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        question = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        first = question.split(maxsplit=1)[0] if question.strip() else ""
        name = (
            first.removeprefix("script:")
            if first.startswith("script:")
            else os.environ.get("KIT_SCRIPT", "standard")
        )
        if name not in self._models:
            self._models[name] = ScriptedModel(FAULT_SCRIPTS[name])
        return await self._models[name].request(messages, tools)


def fault_agent() -> Agent:
    """The test agent with ``nap`` and ``careful_send``; each run's question picks its
    script."""
    return Agent(
        name="kit-faults",
        system_prompt="You are a test agent.",
        tools=(lookup, record, write_once, blind_write, send, nap, careful_send),
        resolve_scope=resolve,
        default_model=ByQuestion,
    )


def fault_engine(url: str, *, notifier: Notifier | None = None, **settings: Any) -> Engine:
    """An in-process engine on ``url`` for ``fault_agent``."""
    return Engine(
        agent=fault_agent(),
        model=ByQuestion(),
        settings=Settings(database_url=url, **settings),
        notifier=notifier or MemoryNotifier(),
    )


def spawn_agent(*args: str, agent: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """``spawn`` for another agent of this kit (``--agent kit:fault_agent``)."""
    with log.open("a") as sink:
        return subprocess.Popen(
            [PYTHON, "-m", "tether", *args, "--agent", agent],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )


def write_effect(ctx: ToolContext, tool_name: str, item: str) -> dict[str, Any]:
    """Apply one write downstream for ``ctx``'s key (no deduplication); honours
    ``inject_failure`` like the kit's own writes."""
    return _apply(ctx, tool_name, item, dedupe=False)
