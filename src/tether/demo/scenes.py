"""The five scenes of the demo story (reference §8), each returning what it expected and what
the store and the sandbox actually recorded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tether.demo.render import (
    grant_panel,
    ledger_table,
    notice_panel,
    refusal_panel,
    stream_text,
)
from tether.demo.stage import (
    ACCOUNT,
    DEADLINE_S,
    HEARTBEAT_TIMEOUT_S,
    QUESTION,
    SceneResult,
    Stage,
)
from tether.engine import Engine
from tether.errors import AlreadyResumed, Changed, TetherError
from tether.store import LedgerEntry

# -- scene 1: the send suspends for confirmation ----------------------------------------------


async def scene_suspend(stage: Stage) -> SceneResult:
    """Dana asks; the quote is drafted and the send waits for her confirmation."""
    say = stage.console.print
    stage.reset_sandbox()
    run = await stage.engine.start_run("dana", QUESTION)
    say(f"run {run.id[:8]}: dana asks [italic]{QUESTION}[/italic]")
    watching = asyncio.create_task(stream_text(stage.engine, run.id, stage.console))
    await stage.engine.run_until_stop(run.id)
    await asyncio.wait_for(watching, DEADLINE_S)
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
        if any(o.run_id == run_id for o in await engine.runner.recover_orphans()):
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
    # Said, so that its "before 0" below does not contradict the quotes of earlier scenes.
    say("the CRM is put back to its seed: Henderson at silver, no hold, no quotes yet")
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
