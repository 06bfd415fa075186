"""Deciding a suspended run's pending calls by run and tool call id (reference §6, §15):
every entry is checked before any is recorded, then each goes through the one decision
by run (``resume.by_run``), and each call gets the answer its token would have had.

Each entry but the suspension's last is recorded; the last claims the run and carries the
turn out, and every call of this request it carried out answers as it was carried out
(its verdict or its refusal), never ``recorded``, even when a later call was refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.approvals import resume
from tether.approvals.inbox import may_decide
from tether.approvals.request import Asked, asked, suspended_on, tool_arguments
from tether.errors import InvalidInput, NotFound, TetherError
from tether.results import CallDecision, CallVerdict
from tether.runs import Run

MAX_DECISIONS = 100
_FIELDS = frozenset({"tool_call_id", "decision", "reason", "arguments", "digest"})
# The refusals a decision meets on its own call (reference §4, §12): answered inside that
# call's result. Anything else (the database is unreachable, ...) answers the request.
REFUSALS = frozenset(
    {
        "unknown_or_expired",
        "already_resumed",
        "no_longer_permitted",
        "changed",
        "guard_failed",
        "wrong_version",
        "tool_unavailable",
        "invalid_input",
        "already_decided",
    }
)


@dataclass(frozen=True, kw_only=True)
class _Entry:
    tool_call_id: str
    ask: Asked
    shown_digest: str | None
    # The run the call belongs to: the run named, or a run of its subtree (reference §18).
    run_id: str


async def decide_calls(
    services: Services,
    owner: str,
    run_id: str,
    approver: str,
    decisions: Sequence[Mapping[str, Any]],
) -> list[CallDecision]:
    """Decide the named calls of ``run_id`` and of the runs of its subtree (its child runs,
    theirs, ..., reference §18) as ``approver``, in the order given; each decision claims
    only the run its call belongs to.

    ``not_found`` when the run is missing or ``approver`` may not decide it (its owner or
    an approver by the owner's scope now); ``invalid_input``, with nothing recorded, when
    any entry is malformed, names a call twice, or names a call that is neither pending
    nor decided on this run or its subtree. A decided call answers ``already_resumed`` in
    its result."""
    run = await hop(services.store.get_run, inputs.run_id(run_id))
    if run is None:
        raise NotFound("no such run")
    runs = await _subtree(services, run)
    if not await may_decide(services, run.user_id, approver) and not await _escalated_to(
        services, runs, approver
    ):
        raise NotFound("no such run")
    entries = [await _checked(services, runs, approver, raw) for raw in _listed(decisions)]
    if len({e.tool_call_id for e in entries}) != len(entries):
        raise InvalidInput("each tool_call_id may be decided once per request")
    results = []
    for entry in entries:
        try:
            result = await resume.by_run(
                services, owner, entry.run_id, entry.tool_call_id, entry.shown_digest, entry.ask
            )
        except TetherError as exc:
            if exc.code not in REFUSALS:
                raise
            results.append(CallDecision(tool_call_id=entry.tool_call_id, refused=exc))
        else:
            results.append(CallDecision(tool_call_id=entry.tool_call_id, result=result))
    carried = {c.tool_call_id: c for r in results for c in _carried_by(r)}
    return [_as_carried(r, carried) for r in results]


def _carried_by(answer: CallDecision) -> tuple[CallDecision, ...]:
    """The other calls the request of ``answer``'s decision carried out (its claim carried
    the turn out), whether its own call took effect or was refused."""
    if answer.result is not None:
        return answer.result.carried
    carried = answer.refused.carried if answer.refused is not None else ()
    return tuple(call for call in carried if isinstance(call, CallDecision))


def _as_carried(mine: CallDecision, carried: Mapping[str, CallDecision]) -> CallDecision:
    """A call recorded by an entry and carried out by the claim of another answers as it
    was carried out: its verdict, or its refusal (reference §15)."""
    if mine.result is None or mine.result.outcome is not CallVerdict.RECORDED:
        return mine
    return carried.get(mine.tool_call_id, mine)


def _listed(decisions: Any) -> list[Mapping[str, Any]]:
    if not isinstance(decisions, Sequence) or isinstance(decisions, str | bytes):
        raise InvalidInput("decisions must be a list of decisions")
    if not 1 <= len(decisions) <= MAX_DECISIONS:
        raise InvalidInput(f"decisions must hold 1 to {MAX_DECISIONS} decisions")
    for raw in decisions:
        if not isinstance(raw, Mapping):
            raise InvalidInput("each decision must be an object")
        extra = set(raw) - _FIELDS
        if extra:
            raise InvalidInput(f"unknown field in a decision: {sorted(extra)[0]}")
    return list(decisions)


async def _escalated_to(services: Services, runs: Sequence[Run], approver: str) -> bool:
    """Whether some pending call of ``runs`` was escalated to ``approver`` (reference §19):
    they may decide it (each call is checked again when it is decided)."""
    for run in runs:
        for call in run.suspension_calls():
            if call.escalated_at is not None and await may_decide(
                services.serving(run), run.user_id, approver, call=call
            ):
                return True
    return False


async def _subtree(services: Services, run: Run) -> list[Run]:
    """``run`` and its descendants, ``run`` first (only ``run`` when it has none): the runs
    a decision through it may decide calls of (reference §18)."""
    if not run.is_child and not services.agent.subagents:
        return [run]
    tree = await hop(services.store.tree, run.id)
    inside = {run.id}
    for member in tree:  # parents before children
        if member.parent_run_id in inside:
            inside.add(member.id)
    return [run, *(m for m in tree if m.id in inside and m.id != run.id)]


async def _checked(
    services: Services, runs: Sequence[Run], approver: str, raw: Mapping[str, Any]
) -> _Entry:
    """One entry, checked as its token's decision would be, and the call it names known
    on one of ``runs`` (the run named and its subtree; tool call ids are unique across a
    tree): the pending call, or one already decided."""
    call_id = raw.get("tool_call_id")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= 128:
        raise InvalidInput("tool_call_id must be the id of a pending call (1 to 128 characters)")
    ask = asked(
        raw.get("decision"),
        approver,
        reason=raw.get("reason"),
        arguments=raw.get("arguments"),
        digest=raw.get("digest"),
    )
    for run in runs:
        found = await suspended_on(services, run.id, call_id)
        call = found.call if found.run is not None else None
        if call is not None:
            if ask.arguments is not None:  # invalid_input, nothing recorded
                tool_arguments(services.serving(run), call.pending, ask.arguments)
            # The request as read here is the one decided (one re-suspended since is not);
            # ``digest``, as with its token, is compared with the preview re-rendered after
            # the claim (``changed`` when it differs; absent: the pending preview's).
            return _Entry(
                tool_call_id=call_id, ask=ask, shown_digest=call.pending.digest, run_id=run.id
            )
    for run in runs:
        if await hop(services.store.decision_for_call, run.id, call_id) is not None:
            return _Entry(tool_call_id=call_id, ask=ask, shown_digest=None, run_id=run.id)
    where = "this run" if len(runs) == 1 else "this run or a run of its tree below it"
    raise InvalidInput(f"tool_call_id {call_id!r} is not a pending call of {where}")
