"""Named failpoints (reference §7): a way to stop the process at each gap of the step protocol.

``TETHER_FAILPOINTS="after_tool_commit=crash"`` exits the process at once with
``os._exit(137)`` (no cleanup, like SIGKILL) when it reaches that point; ``=error`` raises
``FailpointError`` instead. ``NAME:TOOL=ACTION`` fires only for calls of that tool.
Tests in the same process use ``set_failpoint`` / ``clear_failpoints``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from tether.errors import ConfigError, FailpointError

log = logging.getLogger(__name__)

# Every gap between two durable writes, in the order a step meets them.
POINTS: tuple[str, ...] = (
    "after_compaction",  # a compaction is durable; the next model call is not made
    "before_model_call",  # the loop is about to call the model; nothing new is durable
    "after_rate_lease",  # the fleet's model capacity is leased (§13); the model is not called
    "before_next_model",  # a model of the list failed, the next is not asked (§21)
    "after_model_call",  # the model answered; its turn is not persisted
    "after_reads",  # a read-only step's reads returned; nothing of the turn is durable
    "after_intent",  # the assistant turn and its ledger intents are durable; no tool ran
    "before_tool_call",  # one tool call is about to run; earlier calls' results are durable
    "after_tool_commit",  # a tool returned (its effect committed); its result is not durable
    "after_step_persist",  # a tool result (or a whole read-only step) is durable
    "before_suspend",  # a preview is rendered for confirmation; the suspension is not durable
    "after_suspend",  # the suspension is durable; the notice is not sent
    "after_children_started",  # a parent's children and its waiting state are durable (§18)
    "before_child_results",  # a parent's children stopped; their results are not durable (§18)
    "after_decision_recorded",  # a decision is recorded; others of its turn are undecided
    "after_approval_recorded",  # one of a quorum's approvals is recorded (§19); not the N-th
    "after_escalated",  # a call's escalation is durable (§19); its notice is not sent
    "after_rotation_batch",  # a batch of values is re-sealed under the first key (§20)
    "after_claim",  # a resumption claimed the run; nothing else done
    "after_resume_execute",  # an approved call's result is durable; the run not handed back
    "after_outcome_found",  # reconciling learnt a write's outcome; nothing of it is stored
    "after_reconcile",  # the reaper appended a reconciled result; the run not handed back
    "after_tick_claim",  # a schedule's tick claimed, its run not inserted (one transaction)
    "after_run_end",  # a run stopped; its thread's next queued run is not started yet
    "after_erasure_batch",  # a batch of an erasure's runs or threads is deleted (§20); not the rest
)
ACTIONS = ("crash", "error")

_lock = threading.Lock()
_active: dict[tuple[str, str | None], str] | None = None


def parse(spec: str) -> dict[tuple[str, str | None], str]:
    """Parse ``name=action[,name:tool=action…]``; unknown names or actions are an error."""
    parsed: dict[tuple[str, str | None], str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        target, sep, action = item.partition("=")
        name, _, tool = target.partition(":")
        if not sep or name not in POINTS or action not in ACTIONS:
            raise ConfigError(
                f"bad failpoint {item!r}: expected NAME[:TOOL]=crash|error with NAME one of "
                + ", ".join(POINTS)
            )
        parsed[(name, tool or None)] = action
    return parsed


def _points() -> dict[tuple[str, str | None], str]:
    global _active
    with _lock:
        if _active is None:
            _active = parse(os.environ.get("TETHER_FAILPOINTS", ""))
        return _active


def set_failpoint(name: str, action: str, tool: str | None = None) -> None:
    """Arm a failpoint in this process (test API)."""
    parse(f"{name}{':' + tool if tool else ''}={action}")
    points = _points()
    with _lock:
        points[(name, tool)] = action


def clear_failpoints() -> None:
    """Disarm every failpoint in this process and forget the environment's (test API)."""
    global _active
    with _lock:
        _active = {}


def fail(name: str, tool: str | None = None) -> None:
    """Reach failpoint ``name`` (for a call of ``tool``, if any): crash or raise if armed."""
    points = _points()
    if not points:
        return
    action = points.get((name, tool)) if tool else None
    action = action or points.get((name, None))
    if action is None:
        return
    if action == "crash":
        log.warning("failpoint crash", extra={"action": "failpoint", "failpoint": name})
        sys.stderr.flush()
        os._exit(137)
    raise FailpointError(f"failpoint {name} reached", failpoint=name)
