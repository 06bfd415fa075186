"""Limits and consumed budget: restored on every load, only ever grown (invariant 4)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether.errors import InvalidInput
from tether.reasons import HaltReason


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The bounds a run may consume."""

    max_steps: int = 20
    max_spend_usd: float = 1.0
    max_tool_calls: int = 40
    max_elapsed_ms: int = 600_000

    def to_json(self) -> dict[str, Any]:
        return {
            "max_steps": self.max_steps,
            "max_spend_usd": self.max_spend_usd,
            "max_tool_calls": self.max_tool_calls,
            "max_elapsed_ms": self.max_elapsed_ms,
        }

    def extended(self) -> Limits:
        """The default continuation grant of reference §6."""
        return Limits(
            max_steps=self.max_steps + 4,
            max_spend_usd=round(self.max_spend_usd * 1.5, 6),
            max_tool_calls=self.max_tool_calls + 4,
            max_elapsed_ms=math.ceil(self.max_elapsed_ms * 1.5),
        )

    def at_most(self, cap: Limits) -> Limits:
        """These limits, each lowered to ``cap``'s where that is lower."""
        return Limits(
            max_steps=min(self.max_steps, cap.max_steps),
            max_spend_usd=min(self.max_spend_usd, cap.max_spend_usd),
            max_tool_calls=min(self.max_tool_calls, cap.max_tool_calls),
            max_elapsed_ms=min(self.max_elapsed_ms, cap.max_elapsed_ms),
        )


# The most a run may have (``TETHER_MAX_LIMITS``, reference §5) unless configured otherwise.
DEFAULT_MAX_LIMITS = Limits(
    max_steps=200, max_spend_usd=50.0, max_tool_calls=400, max_elapsed_ms=86_400_000
)


class LimitsInput(BaseModel):
    """Limits as a caller may pass them; every field optional, all positive. Strict:
    numbers must be numbers (``"5"`` is refused) and a boolean is not an integer."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_steps: int | None = Field(default=None, gt=0, le=100_000)
    max_spend_usd: float | None = Field(default=None, gt=0, le=1_000_000)
    max_tool_calls: int | None = Field(default=None, gt=0, le=1_000_000)
    max_elapsed_ms: int | None = Field(default=None, gt=0, le=30 * 86_400_000)

    def over(self, base: Limits) -> Limits:
        return replace(base, **self.model_dump(exclude_none=True))


def parse_limits(data: Any, base: Limits | None = None) -> Limits:
    """Validate caller-supplied limits (a mapping or ``Limits``) over ``base``."""
    base = base or Limits()
    if data is None:
        return base
    if isinstance(data, Limits):
        data = data.to_json()
    try:
        return LimitsInput.model_validate(data).over(base)
    except ValidationError as exc:
        said = "; ".join(_said(error) for error in exc.errors(include_url=False))
        raise InvalidInput(f"invalid limits: {said}") from exc


def _said(error: Any) -> str:
    """One validation error of limits, for people: which limit, and what is wrong."""
    where = ".".join(str(part) for part in error.get("loc", ())) or "limits"
    if error.get("type") == "extra_forbidden":
        return f"{where} is not a limit (the limits are {', '.join(LimitsInput.model_fields)})"
    return f"{where}: {error.get('msg', 'invalid')}"


def within_cap(limits: Limits, cap: Limits, what: str) -> Limits:
    """``limits`` when each is at most ``cap``'s, else ``invalid_input`` naming the first
    limit over it (``limit``) and the cap (``cap``). The one check of every way a run gets
    its limits: a start, a continuation (its default grant or named limits), a fork."""
    most = cap.to_json()
    for name, value in limits.to_json().items():
        if value > most[name]:
            raise InvalidInput(
                f"{what} exceed the configured cap: {name} {_number(value)} is over "
                f"{_number(most[name])} (TETHER_MAX_LIMITS)",
                limit=name,
                cap=most,
            )
    return limits


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """What a run has consumed so far. Never reset; resumption restores it from the row."""

    steps: int = 0
    spend_usd: float = 0.0
    tool_calls: int = 0
    elapsed_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "spend_usd": self.spend_usd,
            "tool_calls": self.tool_calls,
            "elapsed_ms": self.elapsed_ms,
        }

    def plus(self, other: Budget) -> Budget:
        """Both budgets' consumption together (a thread's, summed over its runs)."""
        return Budget(
            steps=self.steps + other.steps,
            spend_usd=self.spend_usd + other.spend_usd,
            tool_calls=self.tool_calls + other.tool_calls,
            elapsed_ms=self.elapsed_ms + other.elapsed_ms,
        )

    def after_turn(self, spend_usd: float) -> Budget:
        """The budget after one more model turn that cost ``spend_usd``."""
        return replace(self.after_spend(spend_usd), steps=self.steps + 1)

    def after_spend(self, spend_usd: float) -> Budget:
        """The budget after a model call that is not a turn of the conversation (a
        compaction's summary, reference §14) cost ``spend_usd``."""
        return replace(self, spend_usd=self.spend_usd + spend_usd)

    def after_tool_call(self) -> Budget:
        """The budget after one more counted tool call."""
        return self.after_tool_calls(1)

    def after_tool_calls(self, count: int) -> Budget:
        """The budget after ``count`` more counted tool calls."""
        return replace(self, tool_calls=self.tool_calls + count)

    def after_active(self, elapsed_ms: int) -> Budget:
        """The budget after ``elapsed_ms`` more active time."""
        return replace(self, elapsed_ms=self.elapsed_ms + elapsed_ms)

    def check_before_model_call(self, limits: Limits) -> HaltReason | None:
        """The halt reason if another model call would exceed a bound, else None."""
        if self.steps >= limits.max_steps:
            return HaltReason.MAX_STEPS
        if self.spend_usd >= limits.max_spend_usd:
            return HaltReason.MAX_SPEND
        if self.elapsed_ms >= limits.max_elapsed_ms:
            return HaltReason.MAX_ELAPSED
        return None

    def check_before_tool_call(self, limits: Limits) -> HaltReason | None:
        """The halt reason if another tool call would exceed a bound, else None."""
        if self.tool_calls >= limits.max_tool_calls:
            return HaltReason.MAX_TOOL_CALLS
        if self.elapsed_ms >= limits.max_elapsed_ms:
            return HaltReason.MAX_ELAPSED
        return None


# A limit no run reaches: what a child's undeclared limits are to its own checks.
_UNBOUND = Limits(
    max_steps=2**62, max_spend_usd=float("inf"), max_tool_calls=2**62, max_elapsed_ms=2**62
)


def binding(limits: Limits, route: dict[str, Any], *, child: bool) -> Limits:
    """The limits that bind a run on its own: all of a top-level run's; of a child's, only
    those its sub-agent declares (``route["limits"]``), its others being its root's figures
    as they were when it started, which bind only through the tree's check (reference §18),
    so a grant to the root reaches them."""
    if not child:
        return limits
    declared = set(route.get("limits") or ())
    own = limits.to_json()
    return Limits(**{k: own[k] if k in declared else v for k, v in _UNBOUND.to_json().items()})


@dataclass(kw_only=True)
class TreeBudget:
    """How a claimed run checks its budget in a tree of sub-agents (reference §18): whether
    it is in one (a child, or a run of an agent with sub-agents), the limits that bind it on
    its own (``binding``), the root's limits as its last check read them (a new child's
    where it declares none), and the calls it counted before they ran (``prepaid``)."""

    tree: bool
    binding: Limits
    root_limits: Limits
    prepaid: set[str]
    # The run and its ancestors (a tree's shape never changes), once read; the tree's
    # figures as its last write that counted them returned them (None: read them).
    chain: list[str] | None = None
    seen: list[TreeNode] | None = None

    @classmethod
    def of(cls, limits: Limits, route: dict[str, Any], *, child: bool, parent: bool) -> TreeBudget:
        return cls(
            tree=child or parent,
            binding=binding(limits, route, child=child),
            root_limits=limits,
            prepaid=set(),
        )


@dataclass(frozen=True, kw_only=True)
class TreeNode:
    """One run of a tree of sub-agents as its budget check sees it (reference §18)."""

    id: str
    parent_id: str | None
    limits: Limits
    consumed: Budget


def consumed_trees(nodes: Sequence[TreeNode]) -> dict[str, Budget]:
    """Each run's ``consumed_tree``: its own consumption plus all its descendants'."""
    totals = {n.id: n.consumed for n in nodes}
    parent = {n.id: n.parent_id for n in nodes}
    for node in nodes:
        above = node.parent_id
        seen = 0
        while above is not None and above in totals and seen < len(nodes):
            totals[above] = totals[above].plus(node.consumed)
            above = parent.get(above)
            seen += 1
    return totals


def tree_halt(
    run_id: str, nodes: Sequence[TreeNode], before: Literal["model", "tool"]
) -> tuple[HaltReason, str] | None:
    """The one budget check of a tree (reference §18), before a model call or a tool call
    of ``run_id``: its own ``consumed_tree`` and each of its ancestors', nearest first,
    against that run's limits (a run without children: its own consumption). The halt
    reason and the run whose limits stop it, or None."""
    by_id = {n.id: n for n in nodes}
    totals = consumed_trees(nodes)
    above: str | None = run_id
    while above is not None and above in by_id:
        ancestor = by_id[above]
        tree = totals[above]
        reason = (
            tree.check_before_model_call(ancestor.limits)
            if before == "model"
            else tree.check_before_tool_call(ancestor.limits)
        )
        if reason is not None:
            return reason, above
        above = ancestor.parent_id
    return None
