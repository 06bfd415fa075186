"""What a run's owner may do to it from its page (reference §1, §6): continue a halted run,
with the grant that continuing applies shown before it is asked for, and cancel a run that
is not terminal. The grant shown is ``Limits.extended``, the very method the engine's
continuation applies, never a copy of its arithmetic. In a tree of sub-agents (reference
§18) the grant belongs to the run whose limits halted: a run halted by an ancestor's is
continued through that ancestor, which may be ``waiting``."""

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
    # The ancestor whose limits halted the run: continuing it is the grant (no form here).
    halted_by: str | None = None


def limit_rows(first: Limits, second: Limits) -> tuple[Row, ...]:
    """Two sets of limits side by side, one row per limit, as the page shows budgets."""
    return (
        ("steps", first.max_steps, second.max_steps),
        ("spend (USD)", f"{first.max_spend_usd:.4f}", f"{second.max_spend_usd:.4f}"),
        ("tool calls", first.max_tool_calls, second.max_tool_calls),
        ("active time (ms)", first.max_elapsed_ms, second.max_elapsed_ms),
    )


def actions_for(
    run: Run, *, error: str | None = None, reason: str = "", holds: bool = False
) -> Actions:
    """What the owner may do to ``run`` as it is now; ``holds``: runs of its tree are halted
    by its limits (a ``waiting`` parent is then continued to resume them)."""
    by_ancestor = run.state is RunState.HALTED and run.halted_by not in (None, run.id)
    grant = None
    if (run.state is RunState.HALTED and not by_ancestor) or (
        run.state is RunState.WAITING and holds
    ):
        grant = limit_rows(run.limits, run.limits.extended())
    return Actions(
        grant=grant,
        cancel=not run.state.terminal,
        error=error,
        reason=reason,
        halted_by=run.halted_by if by_ancestor else None,
    )
