"""The demo story (SPEC §8), told with real runs, a real sandbox CRM and a scripted model.

Five scenes on a fresh SQLite database in a temporary folder, each returning what it
expected and what the store and the sandbox actually recorded; ``main`` prints them as a
summary and returns 1 if any scene differs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether.config import Settings
from tether.engine import Engine
from tether.errors import AlreadyResumed, Changed, TetherError
from tether.logs import configure
from tether.models.base import Message
from tether.notify import MemoryNotifier, Notice
from tether.sandbox import start_in_thread
from tether.sandbox.agent import build_agent, demo_model
from tether.store import Event, LedgerEntry

ACCOUNT = "4471"
QUESTION = "Draft and send a quote for Henderson: 200 of SKU-4411."
HEARTBEAT_TIMEOUT_S = 0.5  # short, so the reaper can take over a dead worker's run quickly
DEADLINE_S = 30.0


@dataclass(frozen=True, kw_only=True)
class SceneResult:
    """One scene: what it expected and what the store and the sandbox recorded."""

    number: int
    title: str
    expected: dict[str, Any]
    observed: dict[str, Any]
    run_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.observed == self.expected


@dataclass(kw_only=True)
class Stage:
    """Everything the scenes share: the engine, its notices, the sandbox, the console."""

    console: Console
    engine: Engine
    notifier: MemoryNotifier
    settings: Settings
    sandbox_url: str
    crm: httpx.Client  # the sandbox's admin endpoints

    def new_engine(self) -> Engine:
        """Another engine on the same database, as a second process would have."""
        return Engine(
            agent=build_agent(),
            model=demo_model(),
            settings=self.settings,
            notifier=self.notifier,
        )

    def reset_sandbox(self) -> None:
        self.crm.post("/admin/reset").raise_for_status()

    def quotes(self) -> dict[str, Any]:
        """The sandbox's own count of Henderson's quotes: drafted, sent, and the quotes."""
        response = self.crm.get("/admin/quotes", params={"account_id": ACCOUNT})
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def quotes_of(self, run_id: str) -> list[dict[str, Any]]:
        """The quotes a run drafted: their idempotency key starts with the run's id."""
        return [q for q in self.quotes()["quotes"] if q["created_key"].startswith(f"{run_id}:")]

    def patch_account(self, **changes: Any) -> None:
        self.crm.patch(f"/admin/accounts/{ACCOUNT}", json=changes).raise_for_status()


@contextmanager
def _env_var(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration, then put back what was there."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextmanager
def open_stage(console: Console, *, database_url: str | None = None) -> Iterator[Stage]:
    """A sandbox on a loopback port and an engine on a fresh database (SQLite in a temporary
    folder unless ``database_url`` is given); the tools find the sandbox via the env."""
    with (
        tempfile.TemporaryDirectory(prefix="tether-demo-") as folder,
        start_in_thread(str(Path(folder) / "sandbox.db")) as sandbox,
        _env_var("TETHER_SANDBOX_URL", sandbox.url),
        httpx.Client(base_url=sandbox.url, timeout=10) as crm,
    ):
        settings = Settings(
            database_url=database_url or f"sqlite:///{Path(folder) / 'tether.db'}",
            sandbox_url=sandbox.url,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        )
        notifier = MemoryNotifier()
        engine = Engine(
            agent=build_agent(),
            model=demo_model(),
            settings=settings,
            notifier=notifier,
            migrate=True,
        )
        try:
            yield Stage(
                console=console,
                engine=engine,
                notifier=notifier,
                settings=settings,
                sandbox_url=sandbox.url,
                crm=crm,
            )
        finally:
            engine.close()


# -- scene 1: the send suspends for confirmation ----------------------------------------------


async def scene_suspend(stage: Stage) -> SceneResult:
    """Dana asks; the quote is drafted and the send waits for her confirmation."""
    say = stage.console.print
    stage.reset_sandbox()
    run = await stage.engine.start_run("dana", QUESTION)
    say(f"run {run.id[:8]}: dana asks [italic]{QUESTION}[/italic]")
    await stage.engine.run_until_stop(run.id)
    say(await ledger_table(stage.engine, run.id))
    notice = stage.notifier.last(run.id)
    say(notice_panel(notice))
    stored = (await stage.engine.get_run(run.id)).run
    counts = stage.quotes()
    return SceneResult(
        number=1,
        title="a send waits for confirmation",
        expected={"state": "suspended", "pending": "send_quote", "drafted": 1, "sent": 0},
        observed={
            "state": stored.state.value,
            "pending": stored.pending.tool if stored.pending else None,
            "drafted": counts["drafted"],
            "sent": counts["sent"],
        },
        run_id=run.id,
    )


# -- scene 2: the approval is clicked twice at once -------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Click:
    """One approval attempt: ``ok``, or the error code with the decision that won."""

    ok: bool
    code: str | None = None
    winner: dict[str, Any] = field(default_factory=dict)


async def _click(engine: Engine, token: str, approver: str) -> Click:
    try:
        await engine.resume_after_confirmation(token, "approve", approver)
    except AlreadyResumed as exc:
        return Click(ok=False, code=exc.code, winner=dict(exc.details.get("decision") or {}))
    except TetherError as exc:
        return Click(ok=False, code=exc.code)
    return Click(ok=True)


def _click_in_thread(stage: Stage, token: str, barrier: threading.Barrier) -> Click:
    """One browser tab: its own engine (its own connections), released with the other."""
    engine = stage.new_engine()
    try:
        barrier.wait(timeout=DEADLINE_S)
        return asyncio.run(_click(engine, token, "dana"))
    finally:
        engine.close()


async def scene_double_approval(stage: Stage, run_id: str) -> SceneResult:
    """Two concurrent approvals of one token: one resumes the run, the other is told who won."""
    say = stage.console.print
    token = stage.notifier.last(run_id).token
    barrier = threading.Barrier(2)
    clicks = await asyncio.gather(
        asyncio.to_thread(_click_in_thread, stage, token, barrier),
        asyncio.to_thread(_click_in_thread, stage, token, barrier),
    )
    say("dana clicks [bold]approve[/bold] twice at once (two threads, two engines, one database):")
    for i, click in enumerate(clicks, 1):
        if click.ok:
            say(f"  click {i}: [green]ok[/green]: the send ran once")
        else:
            won = f"{click.winner.get('decision')} by {click.winner.get('by')}"
            say(f"  click {i}: [yellow]{click.code}[/yellow] (the decision that won: {won})")
    outcome = await stage.engine.run_until_stop(run_id)
    say(f"a worker carries the run on: [bold]{outcome.kind.value}[/bold]")
    counts = stage.quotes()
    say(f"the sandbox's records for {ACCOUNT}: drafted {counts['drafted']}, sent {counts['sent']}")
    losers = [c for c in clicks if not c.ok]
    return SceneResult(
        number=2,
        title="approved twice at once",
        expected={
            "ok": 1,
            "already_resumed": 1,
            "winner": "approve by dana",
            "state": "answered",
            "sent": 1,
        },
        observed={
            "ok": sum(c.ok for c in clicks),
            "already_resumed": sum(c.code == "already_resumed" for c in clicks),
            "winner": " by ".join(str(losers[0].winner.get(k)) for k in ("decision", "by"))
            if losers
            else None,
            "state": (await stage.engine.get_run(run_id)).run.state.value,
            "sent": counts["sent"],
        },
        run_id=run_id,
    )


# -- scene 3: the worker dies after the quote commits ------------------------------------------


def worker_env(stage: Stage) -> dict[str, str]:
    """The crash worker's environment: this database and sandbox, the failpoint armed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(
        TETHER_DATABASE_URL=stage.settings.database_url,
        TETHER_SANDBOX_URL=stage.sandbox_url,
        TETHER_FAILPOINTS="after_tool_commit:draft_quote=crash",
    )
    return env


def run_crash_worker(stage: Stage) -> subprocess.CompletedProcess[str]:
    """A real worker process that exits (137, like SIGKILL) once draft_quote has committed."""
    return subprocess.run(
        [sys.executable, "-m", "tether", "worker", "--exit-when-idle", "--no-reap"],
        env=worker_env(stage),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
        check=False,
    )


async def reap_until_recovered(engine: Engine, run_id: str) -> None:
    """Run reaper passes until one takes over ``run_id`` (its heartbeat must go stale)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if any(o.run_id == run_id for o in await engine.recover_orphans()):
            return
        await asyncio.sleep(HEARTBEAT_TIMEOUT_S / 5)
    raise TimeoutError(f"the reaper did not recover run {run_id} within {DEADLINE_S}s")


async def scene_crash(stage: Stage) -> SceneResult:
    """A worker dies between the sandbox's commit and tether's; the reaper reconciles by
    key, and the run goes on without a second quote."""
    say = stage.console.print
    engine = stage.engine
    run = await engine.start_run("dana", QUESTION)
    drafted_before = stage.quotes()["drafted"]
    say(f"a new run {run.id[:8]} waits; a worker process takes it, armed to die after draft_quote")
    worker = await asyncio.to_thread(run_crash_worker, stage)
    say(
        f"the worker exited with code [bold red]{worker.returncode}[/bold red]; the sandbox "
        f"now has {stage.quotes()['drafted'] - drafted_before} new draft, tether's ledger "
        "says:"
    )
    say(await ledger_table(engine, run.id))
    await reap_until_recovered(engine, run.id)
    reconciled = [e for e in await engine.events(run.id) if e.kind == "reconciled"]
    found = reconciled[-1].data["found"] if reconciled else None
    say(
        f"the reaper (in this process) asked the sandbox by idempotency key: [bold]{found}"
        "[/bold]; the quote became draft_quote's result and the run was handed back"
    )
    resumed = await engine.run_until_stop(run.id)
    say(f"a worker carries it on: [bold]{resumed.kind.value}[/bold]; dana approves the send")
    await engine.resume_after_confirmation(stage.notifier.last(run.id).token, "approve", "dana")
    final = await engine.run_until_stop(run.id)
    say(await ledger_table(engine, run.id))
    own = stage.quotes_of(run.id)
    say(f"the run went on to [bold]{final.kind.value}[/bold]; quotes this run drafted: {len(own)}")
    return SceneResult(
        number=3,
        title="a crash after the quote commits",
        expected={"exit_code": 137, "reconciled": "found", "drafted": 1, "sent": 1},
        observed={
            "exit_code": worker.returncode,
            "reconciled": found,
            "drafted": stage.quotes()["drafted"] - drafted_before,
            "sent": sum(q["status"] == "sent" for q in own),
        },
        run_id=run.id,
    )


# -- scene 4: the budget halts the run; its owner continues it ---------------------------------


def repeated_calls(entries: list[LedgerEntry]) -> list[str]:
    """Tool calls made more than once (same tool, same arguments) in one run."""
    calls = Counter(f"{e.tool}({json.dumps(e.arguments, sort_keys=True)})" for e in entries)
    return sorted(call for call, n in calls.items() if n > 1)


async def scene_budget(stage: Stage) -> SceneResult:
    """A run stops at its step budget; dana grants more, and it goes on from where it was."""
    say = stage.console.print
    engine = stage.engine
    run = await engine.start_run("dana", QUESTION, limits={"max_steps": 2})
    halted = await engine.run_until_stop(run.id)
    say(f"run {run.id[:8]} with max_steps=2: [bold]{halted.kind.value}[/bold] ({halted.reason})")
    before = await engine.ledger(run.id)
    await engine.continue_run(run.id, "dana", why="the quote is needed today")
    grant = [e for e in await engine.events(run.id) if e.kind == "continued"][-1]
    say(grant_panel(grant))
    nxt = await engine.run_until_stop(run.id)
    after = await engine.ledger(run.id)
    say(await ledger_table(engine, run.id))
    say(f"its next stop: [bold]{nxt.kind.value}[/bold]; earlier calls were not run again")
    ids = [e.tool_call_id for e in after]
    return SceneResult(
        number=4,
        title="budget halt, continued by its owner",
        expected={
            "halt_reason": "max_steps",
            "grant": "max_steps 2 -> 6 by dana",
            "next_stop": "suspended",
            "earlier_calls_kept": True,
            "repeated_calls": [],
            "drafted": 1,
        },
        observed={
            "halt_reason": halted.reason,
            "grant": f"max_steps {grant.data['old_limits']['max_steps']} -> "
            f"{grant.data['new_limits']['max_steps']} by {grant.data['by']}",
            "next_stop": nxt.kind.value,
            "earlier_calls_kept": after[: len(before)] == before and len(ids) == len(set(ids)),
            "repeated_calls": repeated_calls(after),
            "drafted": len(stage.quotes_of(run.id)),
        },
        run_id=run.id,
    )


# -- scene 5: the world changes under a waiting send -------------------------------------------


async def _approve_expecting(engine: Engine, token: str, approver: str) -> TetherError | None:
    try:
        await engine.resume_after_confirmation(token, "approve", approver)
    except TetherError as exc:
        return exc
    return None


async def scene_stale_approval(stage: Stage) -> SceneResult:
    """While a send waits, Henderson moves to gold and goes on credit hold: the approval is
    refused (``changed``, then ``guard_failed``) instead of sending a stale quote."""
    say = stage.console.print
    engine = stage.engine
    stage.reset_sandbox()
    run = await engine.start_run("dana", QUESTION)
    await engine.run_until_stop(run.id)
    token = stage.notifier.last(run.id).token
    sent_before = stage.quotes()["sent"]
    say(f"run {run.id[:8]} waits for approval of the send; meanwhile, in the CRM:")
    stage.patch_account(discount_tier="gold")
    stage.patch_account(credit_hold=True)
    say("  Henderson moves to the [bold]gold[/bold] tier and is put on [bold]credit hold[/bold]")
    first = await _approve_expecting(engine, token, "dana")
    say(refusal_panel("dana approves the request she was shown", first))
    new_token = str(first.details.get("token")) if isinstance(first, Changed) else ""
    second = await _approve_expecting(engine, new_token, "miguel") if new_token else None
    if new_token:
        say(refusal_panel("miguel (her manager) approves the re-rendered request", second))
    final = await engine.run_until_stop(run.id)
    sent_after = stage.quotes()["sent"]
    say(await ledger_table(engine, run.id))
    say(f"the model is told the send was refused; the run is [bold]{final.kind.value}[/bold]")
    say(f"quotes sent for {ACCOUNT}: before {sent_before}, after {sent_after}")
    diff = first.details.get("diff", []) if isinstance(first, Changed) else []
    return SceneResult(
        number=5,
        title="stale approval refused",
        expected={
            "first": "changed",
            "diff": ["discount_pct", "discount_tier", "lines[0].unit_price", "total"],
            "second": "guard_failed",
            "sent_added": 0,
            "state": "answered",
        },
        observed={
            "first": first.code if first else "ok",
            "diff": sorted(d["path"] for d in diff),
            "second": (second.code if second else "ok") if new_token else "not tried",
            "sent_added": sent_after - sent_before,
            "state": (await engine.get_run(run.id)).run.state.value,
        },
        run_id=run.id,
    )


# -- rendering ---------------------------------------------------------------------------------


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _result_text(content: Any) -> str:
    """A tool result in a few words: the quote, the accounts found, or the error."""
    if isinstance(content, dict) and "error" in content:
        return f"[red]{content['error']}[/red]: {content.get('message', '')}"
    if isinstance(content, dict) and "quote_id" in content:
        return f"{content['quote_id']} {content.get('status')}, total {content.get('total')}"
    if isinstance(content, dict) and "accounts" in content:
        return ", ".join(f"{a['name']} ({a['id']})" for a in content["accounts"]) or "none"
    if isinstance(content, dict) and "unit_price" in content:
        return f"{content['discount_tier']}: {content['unit_price']} each, {content['total']}"
    return _short(content, 40)


def _results(messages: list[Message]) -> dict[str, Any]:
    """Each tool call's durable result, from the run's messages (the state)."""
    out: dict[str, Any] = {}
    for message in messages:
        if message.get("role") == "tool":
            try:
                out[str(message.get("tool_call_id"))] = json.loads(message.get("content") or "")
            except ValueError:
                out[str(message.get("tool_call_id"))] = message.get("content")
    return out


async def ledger_table(engine: Engine, run_id: str) -> Table:
    """The run's tool-call ledger (intent, then ok / error / unknown) with each durable
    result."""
    entries = await engine.ledger(run_id)
    results = _results((await engine.get_run(run_id)).messages)
    table = Table(title="ledger", title_justify="left")
    for column in ("call", "tool", "arguments", "status", "result"):
        table.add_column(column, overflow="fold")
    colours = {"ok": "green", "error": "red", "intent": "yellow", "unknown": "magenta"}
    for e in entries:
        status = e.status.value
        table.add_row(
            e.tool_call_id,
            e.tool,
            ", ".join(f"{k}={v}" for k, v in e.arguments.items()),
            f"[{colours.get(status, 'white')}]{status}[/]",
            _result_text(results[e.tool_call_id]) if e.tool_call_id in results else "",
        )
    return table


def notice_panel(notice: Notice) -> Panel:
    """The approval notice, from the stored call and its re-rendered preview."""
    preview = notice.preview or {}
    table = Table.grid(padding=(0, 2))
    table.add_row("tool", f"[bold]{notice.tool}[/bold] {json.dumps(notice.arguments)}")
    for key in ("quote_id", "account_name", "account_id", "discount_tier", "discount_pct"):
        table.add_row(key, str(preview.get(key)))
    for line in preview.get("lines", []):
        table.add_row("line", f"{line['quantity']} x {line['sku']} at {line['unit_price']}")
    table.add_row("total", f"[bold]{preview.get('total')}[/bold]")
    table.add_row("expires_at", notice.expires_at)
    table.add_row("approve", notice.approve_url[:48] + "…")
    return Panel(table, title=f"approval requested from {notice.user_id}", expand=False)


def grant_panel(grant: Event) -> Panel:
    """The ``continued`` event: who granted what, why, after which halt."""
    data = grant.data
    table = Table("limit", "old", "new", box=None)
    for key, old in data["old_limits"].items():
        table.add_row(key, str(old), str(data["new_limits"][key]))
    head = Text(
        f"by {data['by']}, after {data['previous_halt_reason']}: {data['why']}", style="bold"
    )
    return Panel(Group(head, table), title="event: continued", expand=False)


def refusal_panel(what: str, error: TetherError | None) -> Panel:
    """An approval's answer: the error code and what it carries (the diff, the reason)."""
    if error is None:
        return Panel(f"{what}: [green]ok[/green] (the send ran)", expand=False)
    body = Table.grid(padding=(0, 2))
    body.add_row("error", f"[bold red]{error.code}[/bold red]: {error.message}")
    for change in error.details.get("diff", []):
        body.add_row("  changed", f"{change['path']}: {change['before']} -> {change['after']}")
    if "token" in error.details:
        body.add_row("new token", "issued (the run is suspended again on the new preview)")
    if error.details.get("reason") and error.details["reason"] != error.message:
        body.add_row("reason", str(error.details["reason"]))
    return Panel(body, title=what, expand=False)


def summary_table(results: list[SceneResult]) -> Table:
    table = Table(title="summary", title_justify="left")
    table.add_column("scene", max_width=18)
    table.add_column("expected", overflow="fold")
    table.add_column("observed", overflow="fold")
    table.add_column("")
    for r in results:
        table.add_row(
            f"{r.number}. {r.title}",
            _pairs(r.expected),
            _pairs(r.observed),
            "[green]✓[/green]" if r.ok else "[red]✗[/red]",
        )
    return table


def _pairs(values: dict[str, Any]) -> str:
    return "\n".join(f"{k}={v}" for k, v in values.items())


# -- the story ---------------------------------------------------------------------------------

Scene = Callable[[Stage], Awaitable[SceneResult]]


async def play(stage: Stage) -> list[SceneResult]:
    """Every scene in order, each under its heading; a scene that raises is reported as
    failed with its error, and the story goes on."""
    headings = [
        "1. dana asks for a quote; the send waits for confirmation",
        "2. the approval is clicked twice at once",
        "3. a worker dies after the quote commits",
        "4. a run hits its budget; its owner continues it",
        "5. the failure mode: the world changes while a send waits",
    ]
    results: list[SceneResult] = []
    first = await _scene(stage, headings[0], 1, scene_suspend)
    results.append(first)

    async def approve_twice(s: Stage) -> SceneResult:
        if first.run_id is None:
            raise RuntimeError("scene 1 did not start a run")
        return await scene_double_approval(s, first.run_id)

    scenes: list[Scene] = [approve_twice, scene_crash, scene_budget, scene_stale_approval]
    for number, (heading, scene) in enumerate(zip(headings[1:], scenes, strict=True), 2):
        results.append(await _scene(stage, heading, number, scene))
    return results


async def _scene(stage: Stage, heading: str, number: int, scene: Scene) -> SceneResult:
    stage.console.rule(f"[bold cyan]Scene {heading}")
    try:
        return await scene(stage)
    except Exception as exc:
        stage.console.print(f"[red]the scene failed: {exc!r}[/red]")
        return SceneResult(
            number=number,
            title=heading.split(". ", 1)[1],
            expected={"completed": True},
            observed={"error": repr(exc)},
        )


def main() -> int:
    """Run the demo; 0 when every scene matched its expectation."""
    configure("WARNING")
    console = Console()
    started = time.monotonic()
    console.print(
        Panel(
            "tether: agent runs that survive interruption.\n"
            "A sales assistant drafts and sends quotes in a stand-in CRM (the sandbox), "
            "with a scripted model, on a fresh SQLite database.",
            title="tether demo",
        )
    )
    with open_stage(console) as stage:
        results = asyncio.run(play(stage))
    console.rule("[bold cyan]Summary")
    console.print(summary_table(results))
    failed = [r for r in results if not r.ok]
    elapsed = time.monotonic() - started
    if failed:
        console.print(f"[red]{len(failed)} scene(s) differ from what was expected[/red]")
        return 1
    console.print(f"[green]every scene went as expected[/green] ({elapsed:.1f} s)")
    return 0
