"""Dry runs (reference §12): a run whose writes never execute. The one place that decides a
write is skipped: each write call gets, as its result, the call it would have made, and its
ledger entry is ``skipped``. Reads execute as in any run.

A skipped write is decided before anything else about the call: it does not suspend for
confirmation (nothing will execute), and its permission check, preview and guard are not
run (they serve a call about to execute; a guard may even call the downstream). After a
crash that left its intent without an outcome it is skipped again, never reconciled with
the tool nor re-issued: a dry run's write never reached the tool.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tether._runtime.step.budget_check import budget_stop
from tether._runtime.step.session import RunSession
from tether.failpoints import fail
from tether.messages import ToolCall
from tether.results import Outcome
from tether.store import CallStatus
from tether.tools.tool import Effect, Tool


def skips(session: RunSession, tool: Tool) -> bool:
    """Whether a call of ``tool`` is skipped: a write, in a dry run."""
    return session.run.dry_run and tool.effect is Effect.WRITE


def would_call(call: ToolCall, args: BaseModel) -> dict[str, Any]:
    """The result a skipped write gets: the call, with its validated arguments."""
    return {
        "dry_run": True,
        "would_call": {"tool": call.name, "arguments": args.model_dump(mode="json")},
    }


async def skip(session: RunSession, call: ToolCall, args: BaseModel) -> Outcome | None:
    """Store ``call``'s dry-run result, ledger ``skipped``, counted as a tool call
    (reference §12: budgets bind a dry run as any other); halt instead when the budget is spent.

    Safe twice (a crash before its result is durable): nothing ran, so skipping it again
    stores the same result.
    """
    stop = await budget_stop(session, "tool")
    if stop is not None:
        return stop
    await session.append_result(call, would_call(call, args), CallStatus.SKIPPED, counted=True)
    fail("after_step_persist", call.name)
    return None
