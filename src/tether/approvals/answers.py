"""What a decision's request answers (reference §4, §15): the decider's own call as it was
carried out, and every other call of the turn the request carried out, each as it was
carried out (``executed``, ``declined``, or its §4 error), never ``recorded``.

A request that records the last decision of a suspension carries the turn out, so it may
carry out calls that other requests decided. Their answers travel with the decider's: in
``ApprovalResult.carried`` when the decider's own call took effect, in the refusal's
``carried`` when it was refused, so a call refused after an earlier one moved money
never hides that the money moved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from tether._runtime.step.decided_call import Resolution
from tether.errors import (
    Changed,
    GuardFailed,
    NoLongerPermitted,
    PendingToolUnavailable,
    TetherError,
)
from tether.results import ApprovalResult, CallDecision, CallVerdict, Choice
from tether.runs import RunState

_MISSING_DIGEST = (
    "the digest of the edit's preview is missing, so it was not approved: the request now "
    "waits on the edit under the new token; get its digest with POST "
    "/v1/approvals/{token}/preview (or tether approvals preview TOKEN --arguments JSON) "
    "and approve the new token with it"
)
CHANGED = "the details changed while this was waiting; please review again"
# Why a call approved with the others of its turn is shown again: an earlier call of the
# turn, carried out first, changed what its preview reads (invariant 7).
CHANGED_BY_TURN = (
    "the details changed while this was waiting (a call carried out before it in its turn "
    "may have changed what its preview reads); please review again"
)


def answered(
    run_id: str,
    choice: Choice,
    own: str,
    carried: Mapping[str, Resolution],
    state: RunState,
    *,
    fallback: Resolution,
) -> ApprovalResult:
    """The decider's answer: its own call ``own`` as it was carried out (``fallback`` when
    this request did not reach it: the run stopped on an earlier call, or went elsewhere),
    with every other call this request carried out. Raises the own call's §4 error, the
    others' answers with it."""
    after = _after_a_write(carried)
    others = tuple(
        answer(run_id, k, r, state, after_a_write=after[k]) for k, r in carried.items() if k != own
    )
    mine = answer(
        run_id,
        own,
        carried.get(own, fallback),
        state,
        carried=others,
        after_a_write=after.get(own, False),
    )
    if mine.refused is not None:
        raise mine.refused
    assert mine.result is not None
    return dataclasses.replace(mine.result, decision=choice)


def recorded(
    run_id: str, choice: Choice, carried: Mapping[str, Resolution], waiting_for: int
) -> ApprovalResult:
    """The decider's own call was not reached: the run waits again on an earlier call of
    its turn (``changed``); its decision stands and is carried out with the rest."""
    state = RunState.SUSPENDED
    after = _after_a_write(carried)
    return ApprovalResult(
        run_id=run_id,
        decision=choice,
        state=state,
        outcome=CallVerdict.RECORDED,
        waiting_for=waiting_for,
        carried=tuple(
            answer(run_id, k, r, state, after_a_write=after[k]) for k, r in carried.items()
        ),
    )


def answer(
    run_id: str,
    call_id: str,
    resolution: Resolution,
    state: RunState,
    *,
    carried: tuple[CallDecision, ...] = (),
    after_a_write: bool = False,
) -> CallDecision:
    """One carried call's answer: its verdict, or its refusal (reference §4).
    ``after_a_write``: a call carried out before it in this request executed."""
    refusal = _refusal(run_id, resolution, carried, after_a_write=after_a_write)
    if refusal is not None:
        return CallDecision(tool_call_id=call_id, refused=refusal)
    decided = Choice.DECLINE if resolution.verdict is CallVerdict.DECLINED else Choice.APPROVE
    result = ApprovalResult(
        run_id=run_id, decision=decided, state=state, outcome=resolution.verdict, carried=carried
    )
    return CallDecision(tool_call_id=call_id, result=result)


def _after_a_write(carried: Mapping[str, Resolution]) -> dict[str, bool]:
    """For each carried call, in call order: whether one carried before it executed."""
    seen, after = False, {}
    for call_id, resolution in carried.items():
        after[call_id] = seen
        seen = seen or resolution.verdict is CallVerdict.EXECUTED
    return after


def _refusal(
    run_id: str, r: Resolution, carried: tuple[CallDecision, ...], *, after_a_write: bool
) -> TetherError | None:
    """The §4 error of a call refused on re-check, or None when it took effect."""
    if r.verdict is CallVerdict.NO_LONGER_PERMITTED:
        message = r.reason or "no longer permitted"
        return NoLongerPermitted(message, run_id=run_id, carried=carried)
    if r.verdict is CallVerdict.TOOL_UNAVAILABLE:
        message = r.reason or "the pending tool is not available"
        return PendingToolUnavailable(message, run_id=run_id, carried=carried)
    if r.verdict is CallVerdict.GUARD_FAILED:
        message = r.reason or "refused by the tool's guard"
        return GuardFailed(message, reason=r.reason, carried=carried)
    if r.verdict is not CallVerdict.CHANGED:
        return None
    notice = r.outcome.notice if r.outcome is not None else None
    assert notice is not None
    message = _MISSING_DIGEST if r.unseen else CHANGED_BY_TURN if after_a_write else CHANGED
    return Changed(
        message,
        diff=r.diff,
        token=notice.token,
        preview=notice.preview,
        expires_at=notice.expires_at,
        carried=carried,
    )
