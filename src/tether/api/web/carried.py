"""What became of each call a decision's request carried out (reference §15), as the result
pages show it. The engine answers each call by its id (its verdict, or its §4 error with
that error's fields: a ``changed`` call's diff); a page shows each as the action it names
(its tool and arguments, from the run's turn), in the order the turn ran them. A call
re-checked ``changed`` stops the carrying, so every call carried out before it came first
in its turn: when one of them was a write, that write may be why its preview moved
(invariant 7), which the page explains."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tether.engine import Engine
from tether.errors import NotFound, TetherError
from tether.messages import tool_calls_of
from tether.results import ApprovalResult

# The outcomes of a call that was not carried out and waits for a new decision.
AGAIN = frozenset({"changed"})
# The refusals of an approved call's re-checks (reference §4, §12).
RECHECKED = frozenset({"changed", "guard_failed", "no_longer_permitted", "tool_unavailable"})


def carried_by(answer: ApprovalResult | TetherError) -> list[dict[str, Any]]:
    """The other calls a decision's request carried out, as JSON answers."""
    return [call.to_json() for call in answer.carried]


async def rows(
    engine: Engine, run_id: str | None, answers: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each answer (one per call, the first of a call kept) in the turn's order, with the
    action it names (``action``: ``{"tool", "arguments"}``, or None when the run is gone)
    and the decision it carried out (``decided``: approve, decline, or None)."""
    turn = await _turn(engine, run_id)
    unique: dict[str, dict[str, Any]] = {}
    for answer in answers:
        unique.setdefault(str(answer["tool_call_id"]), dict(answer))
    order = {call_id: n for n, call_id in enumerate(turn)}
    ordered = sorted(unique.values(), key=lambda a: order.get(a["tool_call_id"], len(order)))
    for answer in ordered:
        answer["action"] = turn.get(answer["tool_call_id"])
        answer["decided"] = _decision(answer)
    return ordered


def wrote(shown: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any of these calls was carried out as a write (``executed``)."""
    return any(a.get("outcome") == "executed" for a in shown)


def _decision(answer: Mapping[str, Any]) -> str | None:
    """The decision an answer carried out: its own, the one that used its token
    (``already_resumed``), or an approval for a call refused on re-check."""
    decision = answer.get("decision")
    if isinstance(decision, Mapping):
        decision = decision.get("decision")
    if decision is None and answer.get("outcome") in RECHECKED:
        return "approve"  # only an approved call is re-checked
    return str(decision) if decision is not None else None


def waiting_again(shown: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The calls that were not carried out and wait for a new decision."""
    return [a for a in shown if a.get("outcome") in AGAIN]


async def _turn(engine: Engine, run_id: str | None) -> dict[str, dict[str, Any]]:
    """The tool and arguments of each call of the run, by call id, in call order (a later
    turn's call wins over an earlier one of the same id)."""
    if run_id is None:
        return {}
    try:
        view = await engine.get_run(run_id)
    except NotFound:  # purged meanwhile
        return {}
    calls: dict[str, dict[str, Any]] = {}
    for message in view.messages:
        for call in tool_calls_of(message):
            calls.pop(call.id, None)
            calls[call.id] = {"tool": call.name, "arguments": call.parsed_arguments()}
    return calls
