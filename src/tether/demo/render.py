"""How the demo shows what happened: the ledger, the approval notice, the grant, the
refusals and the summary, each rendered from the stored records (never the model's prose);
and the model's text as it is written, labelled as the model's words."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tether.demo.stage import SceneResult
from tether.engine import Engine
from tether.errors import TetherError
from tether.models.base import Message
from tether.notify import Notice
from tether.results import Delta, LiveEvent

# Where a watch of the demo's first scene ends: the run stopped (it is not terminal yet).
_STOPS = frozenset({"suspended", "halted", "answered", "failed", "cancelled"})


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
    """The run's tool-call ledger (intent, then ok / error / unknown, or skipped in a dry
    run) with each durable result."""
    entries = await engine.ledger(run_id)
    results = _results((await engine.get_run(run_id)).messages)
    table = Table(title="ledger", title_justify="left")
    for column in ("call", "tool", "arguments", "status", "result"):
        table.add_column(column, overflow="fold")
    colours = {
        "ok": "green",
        "error": "red",
        "intent": "yellow",
        "unknown": "magenta",
        "skipped": "cyan",
    }
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


async def stream_text(engine: Engine, run_id: str, console: Console) -> None:
    """Print the model's text of each step of ``run_id`` as it is written (its deltas), a
    line per step, until the run stops; a step whose text came only stored (no delta
    reached this watcher) is printed whole from its ``model_turn``."""
    shown: set[int] = set()
    open_line = False
    async for item in engine.watch(run_id, deltas=True):
        if isinstance(item, Delta):
            if item.offset == 0:  # a step's start (or its restart)
                console.print("\n" if open_line else "", "[dim]model:[/dim] ", sep="", end="")
                shown.add(item.step)
            console.print(Text(item.text), end="", soft_wrap=True)
            open_line = True
        elif item.kind == "model_turn" and item.data.get("text"):
            if item.data.get("step") not in shown:
                shown.add(int(item.data.get("step") or 0))
                console.print("\n" if open_line else "", "[dim]model:[/dim] ", sep="", end="")
                console.print(Text(str(item.data["text"])), end="", soft_wrap=True)
                open_line = True
        elif item.kind in _STOPS:
            break
    if open_line:
        console.print()


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


def grant_panel(grant: LiveEvent) -> Panel:
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
