"""What a run's state says to a person, after the state's name (reference §1, §13): when a
queued run starts, why a halted or failed run stopped, who cancelled a run. A halt
reason belongs to a halted run only: a run cancelled after it halted reads as cancelled."""

from __future__ import annotations

from collections.abc import Sequence

from tether.api.web.shown import when
from tether.reasons import FailReason, HaltReason
from tether.results import LiveEvent
from tether.runs import Run, RunState

HALTED = {
    HaltReason.MAX_STEPS: "it reached its step limit",
    HaltReason.MAX_SPEND: "it reached its spending limit",
    HaltReason.MAX_TOOL_CALLS: "it reached its tool-call limit",
    HaltReason.MAX_ELAPSED: "it reached its time limit",
    HaltReason.SUSPENSION_EXPIRED: "nobody decided its request in time",
    HaltReason.NO_LONGER_PERMITTED: "its owner may no longer do what it asked",
    HaltReason.TOOL_UNAVAILABLE: "the tool it waits on is gone from its agent version",
    HaltReason.FORKED: "a fork waits to be continued",
}
FAILED = {
    FailReason.UNRECONCILABLE: "whether a write went through could not be found out",
    FailReason.RECOVERY_EXHAUSTED: "it was recovered too many times",
    FailReason.ERROR: "an unexpected error stopped it",
    FailReason.MODEL_UNAVAILABLE: "the model could not be reached",
    FailReason.MODEL_ERROR: "the model refused the request",
}


def _reason(code: str | None, words: dict[HaltReason, str] | dict[FailReason, str]) -> str:
    """``code`` in words, the code itself after them (what an operator searches for)."""
    if not code:
        return ""
    said = next((text for reason, text in words.items() if reason.value == code), None)
    return f"{said} ({code})" if said else code


def _queued(run: Run, now: float) -> str:
    parts = []
    if run.start_at is not None and run.start_at > now:
        parts.append(f"starts at {when(run.start_at)}")
    if run.thread_pos > 1:
        parts.append("after the runs before it in its thread have stopped")
    return ", ".join(parts) if parts else "waits for a worker"


def cancelled_by(events: Sequence[LiveEvent]) -> str | None:
    """Who cancelled the run, from its ``cancelled`` event (None if it has none)."""
    found = next((e for e in reversed(events) if e.kind == "cancelled"), None)
    by = found.data.get("by") if found is not None else None
    return str(by) if by else None


def state_note(run: Run, now: float, *, by: str | None = None) -> str:
    """What ``run``'s state means now (judged at the database's ``now``), in a few words;
    ``by``: who cancelled it, when known. Empty when the state's name says it all."""
    match run.state:
        case RunState.QUEUED:
            return _queued(run, now)
        case RunState.RUNNING:
            return "a worker carries it" if run.owner else "waits for a worker"
        case RunState.SUSPENDED:
            return "waits for a decision"
        case RunState.WAITING:
            return "waits for the runs of its sub-agents to stop"
        case RunState.HALTED:
            return _reason(run.halt_reason, HALTED)
        case RunState.FAILED:
            return _reason(run.fail_reason, FAILED)
    # Answered says it all; cancelled says by whom when it is known.
    return f"by {by}" if run.state is RunState.CANCELLED and by else ""
