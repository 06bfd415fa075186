"""Resumption after confirmation (SPEC §4): claim the suspension once, then carry out the
human's decision on the pending call, re-checked now (invariant 7).

An approval executes in the request that carries it: the claim (one conditional UPDATE
that records the decision), the re-checks, the tool or the decline, and its durable
result; the rest of the loop is handed back to the workers.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from tether import calls, inputs
from tether.calls import Check, Resolved
from tether.errors import (
    AlreadyResumed,
    Changed,
    DatabaseUnavailable,
    FailpointError,
    GuardFailed,
    InvalidInput,
    LeaseLost,
    NoLongerPermitted,
    TetherError,
    UnknownOrExpired,
)
from tether.failpoints import fail
from tether.messages import ToolCall
from tether.metrics import APPROVALS
from tether.outcome import Outcome
from tether.previews import diff_previews
from tether.reasons import FailReason, HaltReason
from tether.runs import Run, RunState, iso
from tether.services import Services, hop
from tether.session import RunSession
from tether.store import Decision
from tether.tokens import hash_token

log = logging.getLogger(__name__)


class Choice(str, enum.Enum):
    """What a human decided on a pending call; the stored string."""

    APPROVE = "approve"
    DECLINE = "decline"


class CallVerdict(str, enum.Enum):
    """What became of a decided call."""

    EXECUTED = "executed"
    DECLINED = "declined"
    GUARD_FAILED = "guard_failed"
    NO_LONGER_PERMITTED = "no_longer_permitted"
    CHANGED = "changed"
    REFUSED = "refused"  # no such tool any more, or its arguments no longer validate
    RELEASED = "released"  # nothing was pending to decide; the run went back to the workers
    # The write was attempted and whether it took effect cannot be learnt: the run failed
    # ``unreconcilable`` and waits for a person (its ledger says ``unknown``).
    UNRECONCILABLE = "unreconcilable"
    # The decision is recorded with the run, but this request lost the run to another
    # owner (it was taken for dead) before finishing: that owner carries the decision out.
    CONTINUES_ELSEWHERE = "continues_elsewhere"


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """A decided call's verdict; ``outcome`` is set when the run stopped."""

    verdict: CallVerdict
    outcome: Outcome | None = None
    reason: str | None = None
    diff: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ApprovalResult:
    """A decision that took effect: what was decided, and where the run is now."""

    run_id: str
    decision: Choice
    state: RunState
    outcome: CallVerdict
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "run_id": self.run_id,
            "decision": self.decision.value,
            "state": self.state.value,
            "outcome": self.outcome.value,
        }


def decision_json(decision: Decision) -> dict[str, Any]:
    return {"decision": decision.decision, "by": decision.by, "at": iso(decision.at)}


async def decide(
    session: RunSession, call: ToolCall, decision: Decision, *, recovered: bool
) -> Resolution:
    """Carry out a human decision on ``call``: decline, or re-check (re-resolved scope,
    re-rendered preview against the approved digest, guard) and execute.

    Safe to run twice (a crash after the claim hands it to the reaper): a recovered
    approval first asks the tool whether the write already happened, and a write runs
    under the call's idempotency key.
    """
    r = await calls.resolve(session, call)
    if r is None:
        return Resolution(verdict=CallVerdict.REFUSED)
    if decision.decision == Choice.DECLINE.value:
        await session.refuse(call, "declined_by_user", "the user declined this action")
        return Resolution(verdict=CallVerdict.DECLINED)
    if recovered:
        settled, stop = await calls.settle_decided(session, r)
        if settled:
            return _executed(stop)
    check = await calls.recheck(session, r, confirmed=True, approved_digest=decision.digest)
    if check.verdict is Check.PASSED:
        return _executed(await calls.execute(session, r, confirmed=True))
    return await _refused(session, r, check)


def _executed(stop: Outcome | None) -> Resolution:
    """An approved call that ran: executed, unless its outcome could not be learnt."""
    if stop is not None and stop.reason == FailReason.UNRECONCILABLE.value:
        return Resolution(verdict=CallVerdict.UNRECONCILABLE, outcome=stop)
    return Resolution(verdict=CallVerdict.EXECUTED, outcome=stop)


async def _refused(session: RunSession, r: Resolved, check: calls.Recheck) -> Resolution:
    """What a failed re-check of an approved call does: halt (permissions), suspend again
    on the new preview (changed), or give the model the guard's refusal."""
    if check.verdict is Check.NOT_PERMITTED:
        message = "your permissions changed while this was waiting; please ask again"
        await session.refuse(r.call, "no_longer_permitted", message)
        halted = await session.halt(HaltReason.NO_LONGER_PERMITTED)
        return Resolution(verdict=CallVerdict.NO_LONGER_PERMITTED, outcome=halted, reason=message)
    if check.verdict is Check.CHANGED:
        before = session.run.pending.preview if session.run.pending else None
        suspended = await session.suspend(r.call, r.args, check.preview)
        return Resolution(
            verdict=CallVerdict.CHANGED,
            outcome=suspended,
            diff=diff_previews(before, check.preview),
        )
    await session.refuse(r.call, "guard_failed", check.reason or "refused")
    return Resolution(verdict=CallVerdict.GUARD_FAILED, reason=check.reason)


# -- the approval resumption ------------------------------------------------------------------


def _choice(decision: str, approver: str) -> Choice:
    if decision not in (c.value for c in Choice):
        raise InvalidInput("decision must be one of approve, decline")
    inputs.user_id(approver, "approver")
    return Choice(decision)


def _unknown() -> UnknownOrExpired:
    return UnknownOrExpired("this approval link is unknown or has expired")


async def resume_after_confirmation(
    services: Services, owner: str, token: str, decision: str, approver: str
) -> ApprovalResult:
    """Carry out a human decision on a suspended run: claim first, then re-check, then the
    tool or the decline, and its durable result; the rest of the loop goes to the workers.

    Safe to call twice with one token: only one claim can succeed; the other caller gets
    ``already_resumed`` with the decision that won.
    """
    choice = _choice(decision, approver)
    token_hash = hash_token(inputs.token(token))
    run, used = await _find(services, token_hash)
    if run is None:
        if used is not None and await may_see(services, used.run_id, approver):
            APPROVALS.labels(outcome=AlreadyResumed.code).inc()
            raise AlreadyResumed("this request was already decided", decision=decision_json(used))
        APPROVALS.labels(outcome=UnknownOrExpired.code).inc()
        raise _unknown()
    return await _claim_and_carry_out(services, owner, run, token_hash, choice, approver)


async def _find(services: Services, token_hash: str) -> tuple[Run | None, Decision | None]:
    """The run suspended on a token and the decision that used it, read once for all the
    callers of that token in flight here. A shared read is as good as a caller's own: a
    token exists only once its suspension is durable, and a read that found it unused
    started after the first caller had it, so after that."""
    found, _ = await services.inflight.run(
        ("find", token_hash), lambda: hop(services.store.find_by_token, token_hash)
    )
    return found


async def _claim(
    services: Services, owner: str, run: Run, token_hash: str, choice: Choice, approver: str
) -> Run:
    """Claim the suspension (the one conditional UPDATE that records the decision), or
    raise ``already_resumed`` with the winning decision, or ``unknown_or_expired``.

    Callers of one token in flight here send one claim: the first caller's. The others
    lost to it, or to whatever it lost to, as their own UPDATE would have (a token that
    is not claimable never becomes claimable again), so they are answered from its
    result without waiting on the run's row lock for an UPDATE that cannot win."""
    claim, mine = await services.inflight.run(
        ("claim", token_hash),
        lambda: hop(
            services.store.claim_decision,
            run_id=run.id,
            token_hash=token_hash,
            owner=owner,
            decision=choice.value,
            approver=approver,
        ),
    )
    if mine and claim.run is not None:
        return claim.run
    if claim.decision is not None:
        raise AlreadyResumed(
            "this request was already decided", decision=decision_json(claim.decision)
        )
    raise _unknown()


async def resume_by_run(
    services: Services,
    owner: str,
    run_id: str,
    decision: str,
    approver: str,
    *,
    tool_call_id: str,
    digest: str | None,
) -> ApprovalResult:
    """The same decision, taken from an inbox that knows the run but not the token (only
    its hash is stored). The approver names the call and the preview digest they were
    shown, so a click cannot approve a request re-suspended on another preview after the
    page was rendered. Claims through the same conditional UPDATE as a token.

    Safe to call twice: the second claim finds the run no longer suspended on that call
    and answers ``already_resumed`` with the decision that won.
    """
    choice = _choice(decision, approver)
    if not isinstance(tool_call_id, str) or not 0 < len(tool_call_id) <= 128:
        raise _unknown()
    run = await hop(services.store.get_run, inputs.run_id(run_id))
    current = (
        run is not None
        and run.state is RunState.SUSPENDED
        and run.pending is not None
        and run.pending.tool_call_id == tool_call_id
        and run.pending.digest == digest
        and run.pending_token_hash is not None
    )
    if run is None or not current or run.pending_token_hash is None:
        used = await hop(services.store.decision_for_call, run_id, tool_call_id)
        if used is not None and await may_see(services, run_id, approver):
            raise AlreadyResumed("this request was already decided", decision=decision_json(used))
        raise _unknown()
    return await _claim_and_carry_out(
        services, owner, run, run.pending_token_hash, choice, approver
    )


async def _claim_and_carry_out(
    services: Services, owner: str, run: Run, token_hash: str, choice: Choice, approver: str
) -> ApprovalResult:
    try:
        result = await _claim_then_decide(services, owner, run, token_hash, choice, approver)
    except TetherError as exc:
        APPROVALS.labels(outcome=exc.code).inc()
        raise
    APPROVALS.labels(outcome=result.outcome.value).inc()
    return result


async def _claim_then_decide(
    services: Services, owner: str, run: Run, token_hash: str, choice: Choice, approver: str
) -> ApprovalResult:
    scope = await services.agent.resolve_scope(run.user_id)
    if not scope.may_approve(approver):
        raise _unknown()
    claimed = await _claim(services, owner, run, token_hash, choice, approver)
    log.info("claimed", extra={"run_id": run.id, "action": "claim", "state": choice.value})
    fail("after_claim")
    try:
        session = await RunSession.start(services, claimed)
    except LeaseLost:
        return await _elsewhere(services, run.id, choice)
    try:
        return await _carry_out(session, choice)
    except LeaseLost:
        return await _elsewhere(services, run.id, choice)
    except (DatabaseUnavailable, FailpointError, asyncio.CancelledError):
        raise  # the decision is recorded; a reaper carries it out once this run is stale
    except (NoLongerPermitted, Changed, GuardFailed):
        raise
    except Exception as exc:
        await session.fail_on_error(exc)  # invariant 6: never left ownerless in running
        raise
    finally:
        session.close()


async def _elsewhere(services: Services, run_id: str, choice: Choice) -> ApprovalResult:
    """This request lost the run after claiming it: the decision is stored with the run,
    and the owner that took it over carries it out (a recovery re-checks it first)."""
    log.warning("approval handed over", extra={"run_id": run_id, "action": "lease_lost"})
    run = await hop(services.store.get_run, run_id)
    return ApprovalResult(
        run_id=run_id,
        decision=choice,
        state=run.state if run is not None else RunState.RUNNING,
        outcome=CallVerdict.CONTINUES_ELSEWHERE,
    )


async def _carry_out(session: RunSession, choice: Choice) -> ApprovalResult:
    pending = session.pending_calls()
    decision = session.take_decision(pending[0].id) if pending else None
    if decision is None:
        outcome = await session.release("no pending call to decide")
        return _result(session, choice, outcome, CallVerdict.RELEASED)
    call = pending[0]
    resolution = await decide(session, call, decision, recovered=False)
    fail("after_resume_execute", call.name)
    outcome = resolution.outcome or await session.release("decision carried out")
    if resolution.verdict is CallVerdict.NO_LONGER_PERMITTED:
        raise NoLongerPermitted(resolution.reason or "no longer permitted", run_id=session.run.id)
    if resolution.verdict is CallVerdict.CHANGED:
        notice = outcome.notice
        assert notice is not None
        raise Changed(
            "the details changed while this was waiting; please review again",
            diff=resolution.diff,
            token=notice.token,
            preview=notice.preview,
            expires_at=notice.expires_at,
        )
    if resolution.verdict is CallVerdict.GUARD_FAILED:
        raise GuardFailed(
            resolution.reason or "refused by the tool's guard", reason=resolution.reason
        )
    return _result(session, choice, outcome, resolution.verdict)


def _result(
    session: RunSession, choice: Choice, outcome: Outcome, verdict: CallVerdict
) -> ApprovalResult:
    return ApprovalResult(
        run_id=session.run.id,
        decision=choice,
        state=outcome.state or RunState.RUNNING,
        outcome=verdict,
    )


async def may_see(services: Services, run_id: str, approver: str) -> bool:
    """Whether ``approver`` may learn about ``run_id``'s decisions (owner or approver by
    the owner's scope now); otherwise the token is ``unknown_or_expired``."""
    run = await hop(services.store.get_run, run_id)
    if run is None:
        return False
    scope = await services.agent.resolve_scope(run.user_id)
    return scope.may_approve(approver)
