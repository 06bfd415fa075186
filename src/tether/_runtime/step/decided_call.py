"""Carrying out a human decision on a pending call (reference §4, §9): decline it with the
approver's reason, or re-check it now (invariant 7) and execute it, with the approver's
edited arguments when they edited it. The claim that records the decision, and the
entry points of an approval, are in ``approvals/resume.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from tether._runtime.step import suspending, tool_call
from tether._runtime.step.budget_check import budget_stop
from tether._runtime.step.resolution import Resolved, edited
from tether._runtime.step.session import RunSession
from tether._runtime.step.tool_call import Check
from tether._runtime.step.writes import Result, error_content
from tether.messages import ToolCall
from tether.previews import diff_previews
from tether.reasons import FailReason, HaltReason
from tether.results import UNSEEN_EDIT, CallVerdict, Choice, Outcome
from tether.store import CallStatus, Decision

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """A decided call's verdict; ``outcome`` is set when the run stopped."""

    verdict: CallVerdict
    outcome: Outcome | None = None
    reason: str | None = None
    diff: list[dict[str, Any]] = field(default_factory=list)
    # An edit sent without the digest of its preview: it waits again, never approved.
    unseen: bool = False


@tool_call.traced
async def decide(
    session: RunSession, call: ToolCall, decision: Decision, *, recovered: bool
) -> Resolution:
    """Carry out a human decision on ``call``: decline (with the approver's reason), or
    re-check (re-resolved scope, preview re-rendered from the arguments it runs with against
    the digest the approver saw, guard) and execute, with the approver's edited arguments
    when they edited the call (reference §9).

    Safe to run twice (a crash after the claim hands it to the reaper): a recovered
    approval first asks the tool whether the write already happened, and a write runs
    under the call's idempotency key, which an edit does not change.
    """
    if decision.decision == Choice.DECLINE.value:  # a decline needs no tool
        content = declined(decision.reason)
        await session.append_result(call, content, CallStatus.ERROR, counted=False)
        return Resolution(verdict=CallVerdict.DECLINED)
    if session.services.agent.tool(call.name) is None:
        return await _tool_unavailable(session, call)
    r = await tool_call.resolve(session, call)
    if r is None:
        return Resolution(verdict=CallVerdict.REFUSED)
    unseen = decision.decision == UNSEEN_EDIT  # never runs: it waits again on the edit
    if decision.arguments is not None:
        edit = edited(r, decision.arguments)
        if isinstance(edit, Result):
            await session.append_result(call, edit.content, edit.status, counted=False)
            return Resolution(verdict=CallVerdict.REFUSED)
        r = edit
        if not unseen:
            await session.record_edit(call, decision.arguments)
    if recovered and not unseen:
        settled, stop = await tool_call.settle_decided(session, r)
        if settled:
            return _executed(stop)
    check = await tool_call.recheck(session, r, confirmed=True, approved_digest=decision.digest)
    if unseen and check.verdict in (Check.PASSED, Check.CHANGED):
        check = tool_call.Recheck(verdict=Check.CHANGED, preview=check.preview)
    if check.verdict is Check.PASSED:
        stop = await budget_stop(session, "tool")
        if stop is not None:  # a later call of its turn may have spent the last one
            return Resolution(verdict=CallVerdict.HALTED, outcome=stop)
        # After a crash that followed the claim, a deduplicating write may have run.
        maybe_ran = recovered and r.tool.dedupes
        return _executed(await tool_call.execute(session, r, confirmed=True, maybe_ran=maybe_ran))
    return dataclasses.replace(await _refused(session, r, check), unseen=unseen)


async def _tool_unavailable(session: RunSession, call: ToolCall) -> Resolution:
    """An approved call whose tool this agent version does not have (reference §12): it did not
    run; the model will see why, and the run halts ``tool_unavailable`` for its owner, who
    may move it to a version that has the tool (``tether runs migrate``) and continue it."""
    version = session.services.agent.agent_version
    message = f"the tool {call.name} is not available in agent version {version}"
    await session.refuse(call, "tool_unavailable", message)
    halted = await session.halt(HaltReason.TOOL_UNAVAILABLE)
    return Resolution(verdict=CallVerdict.TOOL_UNAVAILABLE, outcome=halted, reason=message)


def declined(reason: str | None) -> dict[str, Any]:
    """The tool result the model sees for a declined call, with the approver's reason."""
    content: dict[str, Any] = error_content("declined_by_user", "the user declined this action")
    if reason is not None:
        content["reason"] = reason
    return content


def _executed(stop: Outcome | None) -> Resolution:
    """An approved call that ran: executed, unless its outcome could not be learnt."""
    if stop is not None and stop.reason == FailReason.UNRECONCILABLE.value:
        return Resolution(verdict=CallVerdict.UNRECONCILABLE, outcome=stop)
    return Resolution(verdict=CallVerdict.EXECUTED, outcome=stop)


async def _refused(session: RunSession, r: Resolved, check: tool_call.Recheck) -> Resolution:
    """What a failed re-check of an approved call does: halt (permissions), suspend again
    on the new preview (changed; an edited call stays edited), or give the model the
    guard's refusal."""
    if check.verdict is Check.NOT_PERMITTED:
        message = "your permissions changed while this was waiting; please ask again"
        await session.refuse(r.call, "no_longer_permitted", message)
        halted = await session.halt(HaltReason.NO_LONGER_PERMITTED)
        return Resolution(verdict=CallVerdict.NO_LONGER_PERMITTED, outcome=halted, reason=message)
    if check.verdict is Check.CHANGED:
        pending = session.asked(r.call.id)
        before = pending.preview if pending else None
        original = None
        if r.edited is not None:
            original = (pending.edited_from if pending else None) or r.call.parsed_arguments()
        quorum = pending.quorum if pending else 1  # asked when it was first suspended
        suspended = await suspending.suspend_turn(
            session, r.call, r.args, check.preview, edited_from=original, quorum=quorum
        )
        return Resolution(
            verdict=CallVerdict.CHANGED,
            outcome=suspended,
            diff=diff_previews(before, check.preview),
        )
    await session.refuse(r.call, "guard_failed", check.reason or "refused")
    return Resolution(verdict=CallVerdict.GUARD_FAILED, reason=check.reason)
