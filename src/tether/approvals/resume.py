"""The approval resumption (reference §4, §9): check the decision, claim the suspension once
(the one conditional UPDATE that records the decision), then carry it out
(``decided_call.py``); and previews of an edited call, which never claim.

An approval executes in the request that carries it: the claim, the re-checks, the tool
or the decline, and its durable result; the rest of the loop is handed back to the
workers. Everything an approver sends is validated before anything is claimed, so a bad
request changes nothing and the token still works.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from contextlib import AbstractContextManager
from typing import Any

from tether import inputs
from tether._runtime.fleet import versions
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step import approval_deadline, loop
from tether._runtime.step.decided_call import Resolution
from tether._runtime.step.session import RunSession
from tether.approvals import answers, deciders, quorum
from tether.approvals.request import (
    Asked,
    decision_json,
    find_suspended,
    suspended_on,
    tool_arguments,
    unknown_or_expired,
)
from tether.errors import (
    AlreadyDecided,
    AlreadyResumed,
    Changed,
    DatabaseUnavailable,
    FailpointError,
    GuardFailed,
    LeaseLost,
    NoLongerPermitted,
    PendingToolUnavailable,
    TetherError,
    UnknownOrExpired,
)
from tether.failpoints import fail
from tether.messages import tool_calls_of
from tether.results import UNSEEN_EDIT, ApprovalResult, CallVerdict, Choice, StopKind
from tether.runs import Pending, PendingCall, Run, RunState
from tether.store import Decision
from tether.store.claims import SuspensionClaim
from tether.telemetry import tracing
from tether.telemetry.metrics import APPROVALS
from tether.tokens import hash_token

log = logging.getLogger(__name__)


def _already(decision: Decision) -> AlreadyResumed:
    APPROVALS.labels(outcome=AlreadyResumed.code).inc()
    return AlreadyResumed("this request was already decided", decision=decision_json(decision))


# -- deciding ---------------------------------------------------------------------------------


async def by_token(services: Services, owner: str, token: str, ask: Asked) -> ApprovalResult:
    """Carry out a human decision on a call of a suspended run: check it, record it (the
    last decision of the suspension claims the run), then, once claimed, re-check and
    carry out the turn's calls in order; the rest of the loop goes to the workers.

    Safe to call twice with one token: only one decision can use it; the other caller gets
    ``already_resumed`` with the decision that won (its reason and edits included).
    """
    token_hash = hash_token(inputs.token(token))
    found = await find_suspended(services, token_hash)
    run, call, used = found.run, found.call, found.decision
    if run is None or call is None:
        seen = await visible_run(services, used.run_id, ask.approver) if used is not None else None
        with approval_span(services, seen, None, ask):
            if used is not None and seen is not None:
                raise _already(used)
            APPROVALS.labels(outcome=UnknownOrExpired.code).inc()
            raise unknown_or_expired(found.expired, ask.approver)
    return await _claim_and_carry_out(services, owner, run, call, ask)


async def by_run(
    services: Services,
    owner: str,
    run_id: str,
    tool_call_id: str,
    shown_digest: str | None,
    ask: Asked,
) -> ApprovalResult:
    """The same decision, taken from an inbox that knows the run but not the token (only
    its hash is stored). The approver names the call and the digest of the pending preview
    they were shown (``shown_digest``), so a click cannot approve a request re-suspended on
    another preview after the page was rendered; ``ask.digest`` is the digest of the
    re-rendered preview of their edit (the shown one when they did not edit). Decides
    through the same conditional UPDATE.

    Safe to call twice: the second finds the call decided and answers ``already_resumed``
    with the decision that won.
    """
    if ask.digest is None and ask.arguments is None:
        ask = dataclasses.replace(ask, digest=shown_digest)
    found = await suspended_on(services, run_id, tool_call_id)
    run, call = found.run, found.call
    if run is None or call is None or call.pending.digest != shown_digest:
        used = found.decision or await hop(
            services.store.decision_for_call, run_id, str(tool_call_id)
        )
        seen = await visible_run(services, run_id, ask.approver) if used is not None else None
        with approval_span(services, seen, None, ask):
            if used is not None and seen is not None:
                raise _already(used)
            raise unknown_or_expired()
    return await _claim_and_carry_out(services, owner, run, call, ask)


def _recorded(services: Services, pending: Pending, ask: Asked) -> tuple[str, Any, dict[str, Any]]:
    """What the claim records of a decision: the stored decision, the arguments the call
    is to run with when they are not the model's (this edit, or an earlier one the pending
    call carries), and the event's data. Edited arguments are validated by the tool's
    schema here, before anything is claimed (``invalid_input``); arguments equal to the
    pending ones are no edit. A new edit sent without the digest of its preview is not
    an approval (``UNSEEN_EDIT``): the approver has not seen what it would do."""
    event: dict[str, Any] = {"reason": ask.reason}
    arguments = None
    tool = services.agent.tool(pending.tool)
    if tool is None:  # the decision halts the run ``tool_unavailable`` (decided_call.py)
        return ask.choice.value, None, event
    edit = None
    if ask.choice is Choice.APPROVE and ask.arguments is not None:
        edit = tool_arguments(services, pending, ask.arguments).model_dump(mode="json")
        if edit == pending.arguments:
            edit = None  # nothing edited: the approval of the pending call as it is
    if edit is not None:
        arguments = edit
    elif ask.choice is Choice.APPROVE and pending.edited_from is not None:
        arguments = pending.arguments
    if arguments is not None:
        event["arguments_from"] = pending.edited_from or pending.arguments
        event["arguments_to"] = arguments
    if edit is not None and ask.digest is None and tool.preview is not None:
        return UNSEEN_EDIT, arguments, event
    return ask.choice.value, arguments, event


async def _claim(
    services: Services, owner: str, run: Run, call: PendingCall, ask: Asked
) -> SuspensionClaim:
    """Record the decision on ``call`` (the one conditional UPDATE that records it, and
    claims the run when it is the suspension's last), or raise ``already_resumed`` with
    the winning decision, or ``unknown_or_expired``.

    Callers of one token in flight here send one UPDATE: the first caller's. The others
    lost to it, or to whatever it lost to, as their own UPDATE would have (a token that
    is not usable never becomes usable again), so they are answered from its result
    without waiting on the run's row lock for an UPDATE that cannot win."""
    decision, arguments, event = _recorded(services, call.pending, ask)
    counted = quorum.applies(call, ask)  # each person's approval counts (reference §19)
    claim, mine = await services.single_flight.run(
        ("claim", call.token_hash, ask.approver) if counted else ("claim", call.token_hash),
        lambda: hop(
            services.store.claim_decision,
            run_id=run.id,
            token_hash=call.token_hash,
            owner=owner,
            decision=decision,
            approver=ask.approver,
            reason=ask.reason,
            arguments=arguments,
            digest=ask.digest,
            event=event,
            versions=services.versions,
            cap=services.settings.max_active_per_user,
            quorum=call.pending.quorum,
            tool=call.pending.tool,
        ),
    )
    if claim.stale:
        raise quorum.stale(run, call)
    if not mine and claim.approvals is not None:  # the same person's approval, in flight
        raise AlreadyDecided(quorum.AGAIN, approver=ask.approver)
    if mine and claim.run is not None:
        return claim
    if claim.decision is not None:
        raise AlreadyResumed(
            "this request was already decided", decision=decision_json(claim.decision)
        )
    now = await hop(services.store.get_run, run.id)
    if now is not None and now.state is RunState.SUSPENDED and now.lease_epoch == call.epoch:
        versions.check_served(services, now)  # moved to another version meanwhile
    raise unknown_or_expired()


def approval_span(
    services: Services, run: Run | None, call: PendingCall | None, ask: Asked
) -> AbstractContextManager[tracing.Traced]:
    """The decision's ``approval`` span, in the run's trace when the approver may see the
    run (``tracing.py``); its outcome is the verdict or the refusal's code; the reason's
    text only with ``TETHER_OTEL_CONTENT``."""
    pending = call.pending if call is not None else run.pending if run is not None else None
    tool = pending.tool if pending is not None else None
    return tracing.action(
        f"approval {tool}" if tool else "approval",
        run.id if run is not None else None,
        run.trace_context if run is not None else None,
        {
            "gen_ai.tool.name": tool,
            "tether.approval.decision": ask.choice.value,
            "tether.approval.approver": ask.approver,
            "tether.approval.edited": ask.arguments is not None,
            "tether.approval.reason": ask.reason is not None,
        },
        outcome_key="tether.approval.outcome",
        content=services.settings.otel_content,
        private={"tether.approval.reason.text": ask.reason},
    )


async def _claim_and_carry_out(
    services: Services, owner: str, run: Run, call: PendingCall, ask: Asked
) -> ApprovalResult:
    services = services.serving(run)  # a child run's call is its sub-agent's (§18)
    with approval_span(services, run, call, ask) as span:
        try:
            result = await _claim_then_decide(services, owner, run, call, ask)
        except TetherError as exc:
            APPROVALS.labels(outcome=exc.code).inc()
            raise
        APPROVALS.labels(outcome=result.outcome.value).inc()
        span.set_outcome("tether.approval.outcome", result.outcome.value)
        return result


async def _claim_then_decide(
    services: Services, owner: str, run: Run, call: PendingCall, ask: Asked
) -> ApprovalResult:
    scope = await services.agent.resolve_scope(run.user_id)
    await deciders.check(services, scope, call, ask.approver)
    versions.check_served(services, run)  # wrong_version: nothing is claimed (reference §12)
    if quorum.applies(call, ask):  # one of several approvals (reference §19)
        edit = quorum.edited(services, call, ask)
        if edit is not None:
            return await quorum.new_round(services, run, call, ask, edit, scope)
        ask = quorum.seen(run, call, ask)
    claim = await _claim(services, owner, run, call, ask)
    claimed = claim.run
    assert claimed is not None
    if claim.approvals is not None:  # before the N-th: recorded, nothing claimed
        fail("after_approval_recorded")
        return quorum.recorded(run, ask, claim.approvals, call.pending.quorum)
    if not claim.claimed:  # others of the turn are undecided, or the user is at the cap
        log.info(
            "recorded", extra={"run_id": run.id, "action": "record", "state": ask.choice.value}
        )
        if not claim.claimed_or_ready:
            fail("after_decision_recorded")
        return ApprovalResult(
            run_id=run.id,
            decision=ask.choice,
            state=claimed.state,  # running: a worker carries it out once a slot frees
            outcome=CallVerdict.RECORDED,
            waiting_for=claimed.undecided,
        )
    log.info("claimed", extra={"run_id": run.id, "action": "claim", "state": ask.choice.value})
    fail("after_claim")
    own = call.pending.tool_call_id
    carried: dict[str, Resolution] = {}  # what became of each call carried out, in order
    try:
        session = await RunSession.start(services, claimed)
    except LeaseLost:
        return await _elsewhere(services, run.id, ask.choice, own, carried)
    try:
        with approval_deadline.answering_within(services.settings.approval_reconcile_s):
            return await _carry_out(session, ask.choice, own, carried)
    except approval_deadline.HandOver as over:
        return await _reconciling(session, ask.choice, over, own, carried)
    except LeaseLost:
        return await _elsewhere(services, run.id, ask.choice, own, carried)
    except (DatabaseUnavailable, FailpointError, asyncio.CancelledError):
        raise  # the decision is recorded; a reaper carries it out once this run is stale
    except (NoLongerPermitted, Changed, GuardFailed, PendingToolUnavailable):
        raise
    except Exception as exc:
        await session.fail_on_error(exc)  # invariant 6: never left ownerless in running
        raise
    finally:
        session.close()


async def _reconciling(
    session: RunSession,
    choice: Choice,
    over: approval_deadline.HandOver,
    own: str,
    carried: dict[str, Resolution],
) -> ApprovalResult:
    """The approved write's answer was lost and its lookup by key could not reach the
    downstream within ``approval_reconcile_s``: the decision is recorded; the run is
    handed over to the reapers, whose recovery reconciles the call by key (invariant 3:
    never a second execution), and that call answers ``reconciling`` now (the calls
    carried out before it, as they were)."""
    session.close()  # no heartbeat of ours keeps the lease fresh any more
    event = {"tool_call_id": over.tool_call_id, "tool": over.tool}
    try:
        await session.hand_over(event)
    except LeaseLost:
        return await _elsewhere(session.services, session.run.id, choice, own, carried)
    log.warning("approval handed over to reconcile", extra={"run_id": session.run.id})
    reconciling = Resolution(verdict=CallVerdict.RECONCILING)
    carried[over.tool_call_id] = reconciling
    return answers.answered(
        session.run.id, choice, own, carried, RunState.RUNNING, fallback=reconciling
    )


async def _elsewhere(
    services: Services,
    run_id: str,
    choice: Choice,
    own: str,
    carried: dict[str, Resolution],
) -> ApprovalResult:
    """This request lost the run after claiming it: the decision is stored with the run,
    and the owner that took it over carries it out (a recovery re-checks it first). The
    calls this request carried out before it lost the run answer as they were."""
    log.warning("approval handed over", extra={"run_id": run_id, "action": "lease_lost"})
    run = await hop(services.store.get_run, run_id)
    state = run.state if run is not None else RunState.RUNNING
    elsewhere = Resolution(verdict=CallVerdict.CONTINUES_ELSEWHERE)
    return answers.answered(run_id, choice, own, carried, state, fallback=elsewhere)


async def _carry_out(
    session: RunSession, choice: Choice, own: str, carried: dict[str, Resolution]
) -> ApprovalResult:
    """Carry out the turn's calls in order up to its last decided one (each decided call
    re-checked just before it executes; what became of each goes in ``carried``), then
    hand the run back; answer as the decider's own call (``own``) was carried out, with
    the others (``answers.py``). A decider whose call was not reached is answered as the
    call the run stopped on was, or ``recorded`` when the run waits again."""
    stop = await loop.carry_calls(session, carried, decided_only=True)
    if not carried:
        outcome = stop or await session.release("no pending call to decide")
        return ApprovalResult(
            run_id=session.run.id,
            decision=choice,
            state=outcome.state or RunState.RUNNING,
            outcome=CallVerdict.RELEASED,
        )
    if own not in carried and stop is not None and stop.kind is StopKind.SUSPENDED:
        return answers.recorded(session.run.id, choice, carried, len(stop.notices) or 1)
    fail("after_resume_execute", _tool_of(session, own))
    outcome = stop or await session.release("decision carried out")
    state = outcome.state or RunState.RUNNING
    last = list(carried.values())[-1]
    return answers.answered(session.run.id, choice, own, carried, state, fallback=last)


def _tool_of(session: RunSession, call_id: str) -> str | None:
    """The tool of the call ``call_id`` of the run's turn."""
    for message in reversed(session.messages):
        for call in tool_calls_of(message):
            if call.id == call_id:
                return call.name
    return None


async def visible_run(services: Services, run_id: str, approver: str) -> Run | None:
    """The run, when ``approver`` may learn about its decisions (its owner, or an approver
    by the owner's scope now); otherwise the token is ``unknown_or_expired``."""
    run = await hop(services.store.get_run, run_id)
    if run is None:
        return None
    scope = await services.agent.resolve_scope(run.user_id)
    return run if await deciders.allowed(services, scope, approver) else None
