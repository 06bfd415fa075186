"""What a run's owner may do to it from its page (reference §1, §6): continue a halted run,
with the grant that continuing applies shown before it is asked for, and cancel a run that
is not terminal. The grant shown is ``Limits.extended``, the very method the engine's
continuation applies, never a copy of its arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.budget import Limits
from tether.runs import Run, RunState

# One row of a budget table: what is measured, then its values (consumed or limits).
Row = tuple[str, Any, Any]


@dataclass(frozen=True, kw_only=True)
class Actions:
    """The page's Continue and Cancel forms: ``grant`` (the limits now and as granted) when
    the run may be continued, ``cancel`` when it may be cancelled; and, after a refusal,
    why and the reason as it was typed."""

    grant: tuple[Row, ...] | None
    cancel: bool
    error: str | None = None
    reason: str = ""


def limit_rows(first: Limits, second: Limits) -> tuple[Row, ...]:
    """Two sets of limits side by side, one row per limit, as the page shows budgets."""
    return (
        ("steps", first.max_steps, second.max_steps),
        ("spend (USD)", f"{first.max_spend_usd:.4f}", f"{second.max_spend_usd:.4f}"),
        ("tool calls", first.max_tool_calls, second.max_tool_calls),
        ("active time (ms)", first.max_elapsed_ms, second.max_elapsed_ms),
    )


def actions_for(run: Run, *, error: str | None = None, reason: str = "") -> Actions:
    """What the owner may do to ``run`` as it is now."""
    grant = None
    if run.state is RunState.HALTED:
        grant = limit_rows(run.limits, run.limits.extended())
    return Actions(grant=grant, cancel=not run.state.terminal, error=error, reason=reason)
