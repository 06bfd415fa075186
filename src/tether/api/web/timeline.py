"""A run's timeline as a person reads it (reference §3, the run events): each stored event
as a sentence (what happened, by whom), its key figures, and any text it carries (the
model's words, a reason); the raw data stays on the page, folded. An event of a kind this
module does not know still reads as its kind and its plain fields."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tether.api.web.shown import json_text
from tether.api.web.status import FAILED, HALTED
from tether.results import LiveEvent

Data = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class Line:
    """One event of the timeline: its sentence, figures, text, and the raw data."""

    at: float
    kind: str
    what: str
    figures: tuple[str, ...] = ()
    text: str | None = None
    raw: str = "{}"


@dataclass(frozen=True, kw_only=True)
class Said:
    """What an event's data says, before the line is dressed with its time and raw data."""

    what: str
    figures: tuple[str, ...] = ()
    text: str | None = None


def _count(value: Any, one: str, many: str | None = None) -> str:
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else 0
    shown = f"{number:,}" if isinstance(number, int) else f"{number:g}"
    return f"{shown} {one if number == 1 else (many or one + 's')}"


def _usd(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, int | float) else "$—"


def _limits(limits: Any) -> str:
    """A budget's limits in a few words (``LimitsOut``'s fields)."""
    if not isinstance(limits, Mapping):
        return ""
    seconds = limits.get("max_elapsed_ms")
    time = f"{seconds / 1000:g} s" if isinstance(seconds, int | float) else "—"
    return (
        f"limits: {_count(limits.get('max_steps'), 'step')}, {_usd(limits.get('max_spend_usd'))}"
        f", {_count(limits.get('max_tool_calls'), 'tool call')}, {time}"
    )


def _by(data: Data, key: str = "by") -> str:
    return f" by {data[key]}" if data.get(key) else ""


def _reason_text(data: Data, key: str) -> str | None:
    value = data.get(key)
    return str(value) if value else None


def _created(data: Data) -> Said:
    figures = [_limits(data.get("limits"))]
    if data.get("priority"):
        figures.append(f"priority {data['priority']}")
    kind = "Follow-up asked" if data.get("follow_up") else "Asked"
    return Said(what=f"{kind}{_by(data, 'user_id')}", figures=tuple(f for f in figures if f))


def _model_turn(data: Data) -> Said:
    calls = [str(name) for name in data.get("tool_calls") or ()]
    asked = "asked for " + ", ".join(calls) if calls else "answered"
    # Which model of TETHER_MODEL wrote it (reference §21); turns stored before have none.
    by = (f"by {data['model']}",) if isinstance(data.get("model"), str) else ()
    figures = (
        *by,
        f"{_count(data.get('input_tokens'), 'token')} in, "
        f"{_count(data.get('output_tokens'), 'token')} out",
        _usd(data.get("spend_usd")),
    )
    return Said(
        what=f"Model turn {data.get('step', '?')}: {asked}",
        figures=figures,
        text=_reason_text(data, "text"),
    )


def _tool_result(data: Data) -> Said:
    status = str(data.get("status") or "done")
    what = f"{data.get('tool', 'A tool')} returned {status}"
    return Said(what=what, figures=(f"call {data.get('tool_call_id', '?')}",), text=None)


def _suspended(data: Data) -> Said:
    calls = data.get("pending_calls") or ()
    more = len(calls) - 1 if isinstance(calls, list) else 0
    also = f" and {_count(more, 'more call')}" if more > 0 else ""
    return Said(what=f"Waiting for a decision on {data.get('tool', 'a call')}{also}")


def _decided(verb: str) -> Callable[[Data], Said]:
    def said(data: Data) -> Said:
        figures = (f"call {data['tool_call_id']}",) if data.get("tool_call_id") else ()
        return Said(what=f"{verb}{_by(data)}", figures=figures, text=_reason_text(data, "reason"))

    return said


def _recorded(data: Data) -> Said:
    """A quorum's approval before the N-th (reference §19): by whom, and how many so far;
    an edit's starts a new round."""
    figures = [f"{data.get('approvals', '?')} of {data.get('quorum', '?')} approvals"]
    if data.get("round") == "new":
        figures.append("edited: a new round")
    if data.get("tool_call_id"):
        figures.append(f"call {data['tool_call_id']}")
    return Said(
        what=f"Approval recorded{_by(data)}",
        figures=tuple(figures),
        text=_reason_text(data, "reason"),
    )


def _escalated(data: Data) -> Said:
    named = ", ".join(str(n).replace("group:", "group ") for n in data.get("escalate_to") or ())
    tool = data.get("tool", "a call")
    return Said(what=f"Escalated {tool}" + (f" to {named}" if named else ""))


def _halted(data: Data) -> Said:
    reason = str(data.get("reason") or "")
    words = next((w for r, w in HALTED.items() if r.value == reason), reason)
    return Said(what=f"Halted: {words}", figures=(reason,) if reason else ())


def _failed(data: Data) -> Said:
    reason = str(data.get("reason") or "")
    words = next((w for r, w in FAILED.items() if r.value == reason), reason)
    return Said(
        what=f"Failed: {words}",
        figures=(reason,) if reason else (),
        text=_reason_text(data, "message") or _reason_text(data, "error"),
    )


def _continued(data: Data) -> Said:
    return Said(
        what=f"Continued{_by(data)}",
        figures=tuple(f for f in (_limits(data.get("new_limits")),) if f),
        text=_reason_text(data, "why"),
    )


def _child(data: Data) -> str:
    """A child run as an event names it (reference §18): its short id."""
    return f"run {str(data.get('run_id') or '?')[:8]}"


def _child_started(data: Data) -> Said:
    figures = (f"call {data['tool_call_id']}",) if data.get("tool_call_id") else ()
    return Said(
        what=f"Started {data.get('agent', 'a sub-agent')}'s {_child(data)}", figures=figures
    )


def _child_halted(data: Data) -> Said:
    reason = str(data.get("halt_reason") or "")
    words = next((w for r, w in HALTED.items() if r.value == reason), reason or "halted")
    figures = tuple(f for f in (reason, _halted_by(data)) if f)
    return Said(what=f"Its {_child(data)} halted: {words}", figures=figures)


def _halted_by(data: Data) -> str:
    by = data.get("halted_by")
    return f"by the limits of run {str(by)[:8]}" if by else ""


def _plain(what: str) -> Callable[[Data], Said]:
    return lambda data: Said(what=what)


SAYINGS: dict[str, Callable[[Data], Said]] = {
    "created": _created,
    "model_turn": _model_turn,
    "tool_result": _tool_result,
    "suspended": _suspended,
    "approved": _decided("Approved"),
    "declined": _decided("Declined"),
    "edited": _decided("Edited"),
    "approval_recorded": _recorded,
    "escalated": _escalated,
    "halted": _halted,
    "failed": _failed,
    "continued": _continued,
    "cancelled": lambda data: Said(what=f"Cancelled{_by(data)}"),
    "answered": lambda data: Said(what=f"Answered at step {data.get('step', '?')}"),
    "released": lambda data: Said(
        what="Handed back to the workers", figures=(str(data["why"]),) if data.get("why") else ()
    ),
    "reconciling": _plain("Handed over to check whether a write went through"),
    "reconciled": _plain("Checked whether a write went through"),
    "recovering": _plain("Taken over after its worker stopped"),
    "notice_reissued": lambda data: Said(what=f"Sent {_count(data.get('calls'), 'notice')} again"),
    "model_retry": lambda data: Said(
        what=f"The model call failed; tried again (attempt {data.get('attempt', '?')})",
        text=_reason_text(data, "error"),
    ),
    "rate_limited": lambda data: Said(
        what=f"Waited {data.get('wait_s', '?')} s for the model's {data.get('limit', '')} limit"
    ),
    "migrated": lambda data: Said(
        what=f"Moved to agent version {data.get('to_version', '?')}{_by(data)}",
        text=_reason_text(data, "why"),
    ),
    "forked": lambda data: Said(
        what=f"Forked{_by(data)} from run {data.get('from_run_id', '?')} at step "
        f"{data.get('step', '?')}",
        figures=("dry run",) if data.get("dry_run") else (),
    ),
    "follow_up": lambda data: Said(
        what="Follow-up opened in its thread",
        figures=(f"{_count(len(data.get('not_executed') or ()), 'call')} left unanswered",)
        if data.get("not_executed")
        else (),
    ),
    "output_invalid": lambda data: Said(
        what=f"The answer did not fit its type ({_count(data.get('count'), 'error')})"
    ),
    "compacted": _plain("The conversation so far was summarised"),
    "child_started": _child_started,
    "child_stopped": lambda data: Said(
        what=f"Its {_child(data)} stopped: {data.get('state', '?')}",
    ),
    "child_halted": _child_halted,
    "start_failed": lambda data: Said(
        what="Could not start; tried again later", text=_reason_text(data, "error")
    ),
}


def _unknown(kind: str, data: Data) -> Said:
    """A kind this module does not know: its name and its plain fields."""
    plain = [
        f"{key}: {value}"
        for key, value in data.items()
        if isinstance(value, str | int | float) and not isinstance(value, bool)
    ]
    return Said(what=kind.replace("_", " ").capitalize(), figures=tuple(plain[:4]))


def line(event: LiveEvent) -> Line:
    """``event`` as the timeline reads it."""
    data = event.data if isinstance(event.data, Mapping) else {}
    saying = SAYINGS.get(event.kind)
    said = saying(data) if saying is not None else _unknown(event.kind, data)
    return Line(
        at=event.at,
        kind=event.kind,
        what=said.what,
        figures=said.figures,
        text=said.text,
        raw=json_text(data, indent=2),
    )
