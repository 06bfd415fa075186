"""The three resumptions (SPEC §1-§4): after confirmation, after a crash, after a budget
halt; and expiry and retention. Each says why running it twice is safe."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tether import inputs
from tether.budget import Limits, parse_limits
from tether.errors import (
    AlreadyFinished,
    AlreadyResumed,
    Changed,
    FailpointError,
    GuardFailed,
    InvalidInput,
    LeaseLost,
    NoLongerPermitted,
    NotFound,
    NotHalted,
    TetherError,
    UnknownOrExpired,
)
from tether.failpoints import fail
from tether.loop import (
    CallVerdict,
    Driver,
    Outcome,
    Services,
    StopKind,
    deliver,
    hash_token,
    new_token,
)
from tether.messages import pending_tool_calls
from tether.metrics import APPROVALS, EXPIRIES, RECOVERIES
from tether.notify import Notice
from tether.runs import Run, iso
from tether.store import Decision

log = logging.getLogger(__name__)
T = TypeVar("T")

DECISIONS = ("approve", "decline")


@dataclass(frozen=True, kw_only=True)
class ApprovalResult:
    """A decision that took effect: what was decided, and where the run is now."""

    ok: bool
    run_id: str
    decision: str
    state: str
    outcome: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "run_id": self.run_id,
            "decision": self.decision,
            "state": self.state,
            "outcome": self.outcome,
            **self.details,
        }


def decision_json(decision: Decision) -> dict[str, Any]:
    return {"decision": decision.decision, "by": decision.by, "at": iso(decision.at)}


async def hop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """One thread hop for one store transaction."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def start_driver(
    services: Services,
    run: Run,
    *,
    recovering: bool = False,
    stopping: asyncio.Event | None = None,
) -> Driver:
    """A driver for a run this process just claimed: loads it, re-resolves the user's
    scope now (invariant 7) and stores the fresh snapshot."""
    lease = run.lease()
    snapshot = await hop(services.store.snapshot, run.id)
    if snapshot is None:
        raise LeaseLost("run vanished after its claim", run_id=run.id)
    scope = await services.agent.resolve_scope(run.user_id)
    await hop(services.store.refresh_scope, lease, scope.to_json())
    return Driver(services, snapshot, lease, scope, recovering=recovering, stopping=stopping)


def _check_decision(decision: str, approver: str) -> None:
    if decision not in DECISIONS:
        raise InvalidInput(f"decision must be one of {', '.join(DECISIONS)}")
    inputs.user_id(approver, "approver")


def _unknown() -> UnknownOrExpired:
    return UnknownOrExpired("this approval link is unknown or has expired")


async def resume_after_confirmation(
    services: Services, owner: str, token: str, decision: str, approver: str
) -> ApprovalResult:
    """Carry out a human decision on a suspended run: claim first (one conditional UPDATE
    that records the decision), then re-resolve, re-render and re-guard, then the tool or
    the decline, and its durable result; the rest of the loop goes to the workers.

    Safe to call twice with one token: only one claim can succeed; the other caller gets
    ``already_resumed`` with the decision that won.
    """
    _check_decision(decision, approver)
    token_hash = hash_token(inputs.token(token))
    run, used = await hop(services.store.find_by_token, token_hash)
    if run is None:
        if used is not None and await _may_see(services, used.run_id, approver):
            APPROVALS.labels(outcome=AlreadyResumed.code).inc()
            raise AlreadyResumed("this request was already decided", decision=decision_json(used))
        APPROVALS.labels(outcome=UnknownOrExpired.code).inc()
        raise _unknown()
    return await _claim_and_carry_out(services, owner, run, token_hash, decision, approver)


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
    shown, so a click cannot approve a request that was re-suspended on another preview
    after the page was rendered. Claims through the same conditional UPDATE as a token.

    Safe to call twice: the second claim finds the run no longer suspended on that call
    and answers ``already_resumed`` with the decision that won.
    """
    _check_decision(decision, approver)
    if not isinstance(tool_call_id, str) or not 0 < len(tool_call_id) <= 128:
        raise _unknown()
    run = await hop(services.store.get_run, inputs.run_id(run_id))
    current = (
        run is not None
        and run.state.value == "suspended"
        and run.pending is not None
        and run.pending.tool_call_id == tool_call_id
        and run.pending.digest == digest
        and run.pending_token_hash is not None
    )
    if not current:
        used = await hop(services.store.decision_for_call, run_id, tool_call_id)
        if used is not None and await _may_see(services, run_id, approver):
            raise AlreadyResumed("this request was already decided", decision=decision_json(used))
        raise _unknown()
    assert run is not None and run.pending_token_hash is not None
    return await _claim_and_carry_out(
        services, owner, run, run.pending_token_hash, decision, approver
    )


async def _claim_and_carry_out(
    services: Services, owner: str, run: Run, token_hash: str, decision: str, approver: str
) -> ApprovalResult:
    try:
        result = await _claim_and_carry_out_once(
            services, owner, run, token_hash, decision, approver
        )
    except TetherError as exc:
        APPROVALS.labels(outcome=exc.code).inc()
        raise
    APPROVALS.labels(outcome=result.outcome).inc()
    return result


async def _claim_and_carry_out_once(
    services: Services, owner: str, run: Run, token_hash: str, decision: str, approver: str
) -> ApprovalResult:
    scope = await services.agent.resolve_scope(run.user_id)
    if not scope.may_approve(approver):
        raise _unknown()
    claimed = await hop(
        services.store.claim_suspended,
        run_id=run.id,
        token_hash=token_hash,
        owner=owner,
        decision=decision,
        approver=approver,
    )
    if claimed is None:
        _, used = await hop(services.store.find_by_token, token_hash)
        if used is not None:
            raise AlreadyResumed("this request was already decided", decision=decision_json(used))
        raise _unknown()
    log.info("claimed", extra={"run_id": run.id, "action": "claim", "state": decision})
    fail("after_claim")
    driver = await start_driver(services, claimed)
    try:
        return await _carry_out(driver, decision)
    except (LeaseLost, FailpointError, asyncio.CancelledError):
        raise
    except (NoLongerPermitted, Changed, GuardFailed):
        raise
    except Exception as exc:
        await driver._fail_on_error(exc)  # invariant 6: never left ownerless in running
        raise


async def _carry_out(driver: Driver, decision: str) -> ApprovalResult:
    calls = pending_tool_calls(driver.messages)
    decided = driver.snapshot.decisions
    if not calls or calls[0].id not in decided:
        outcome = await driver.release("no pending call to decide")
        return _result(driver, decision, outcome, "released")
    call = calls[0]
    tool = driver.s.agent.tool(call.name)
    if tool is None:
        outcome = await driver.drive()
        return _result(driver, decision, outcome, outcome.kind.value)
    args = tool.validate(call.parsed_arguments())
    resolution = await driver.decide(call, tool, args, decided.pop(call.id), recovered=False)
    fail("after_resume_execute", call.name)
    outcome = resolution.outcome or await driver.release("decision carried out")
    if resolution.verdict is CallVerdict.NO_LONGER_PERMITTED:
        raise NoLongerPermitted(resolution.reason or "no longer permitted", run_id=driver.run.id)
    if resolution.verdict is CallVerdict.CHANGED:
        assert resolution.notice is not None
        raise Changed(
            "the details changed while this was waiting; please review again",
            diff=resolution.diff,
            token=resolution.notice.token,
            preview=resolution.notice.preview,
            expires_at=resolution.notice.expires_at,
        )
    if resolution.verdict is CallVerdict.GUARD_FAILED:
        raise GuardFailed(
            resolution.reason or "refused by the tool's guard", reason=resolution.reason
        )
    return _result(driver, decision, outcome, resolution.verdict.value)


def _result(driver: Driver, decision: str, outcome: Outcome, what: str) -> ApprovalResult:
    state = outcome.state.value if outcome.state else "running"
    return ApprovalResult(
        ok=True, run_id=driver.run.id, decision=decision, state=state, outcome=what
    )


async def _may_see(services: Services, run_id: str, approver: str) -> bool:
    run = await hop(services.store.get_run, run_id)
    if run is None:
        return False
    scope = await services.agent.resolve_scope(run.user_id)
    return scope.may_approve(approver)


async def recover_orphans(services: Services, owner: str) -> list[Outcome]:
    """Take over runs whose owner died, reconcile the call that may have run without its
    result being stored (invariant 3), then hand them back to the workers.

    Safe to run twice, and from two reapers at once: each orphan is claimed by one
    conditional UPDATE with a new lease epoch, so only one reaper holds it; a reaper that
    loses the lease mid-way is fenced out; reconciliation only reads by key or re-issues
    under the same key.
    """
    claimed, exhausted = await hop(
        services.store.claim_orphans,
        owner=owner,
        stale_after_s=services.settings.heartbeat_timeout_s,
        max_attempts=services.settings.max_recovery_attempts,
        batch=services.settings.reaper_batch,
    )
    outcomes = [
        Outcome(run_id=run_id, kind=StopKind.FAILED, reason="recovery_exhausted")
        for run_id in exhausted
    ]
    try:
        return await _recover_claimed(services, claimed, outcomes)
    finally:
        for o in outcomes:
            label = (o.reason or "failed") if o.kind is StopKind.FAILED else o.kind.value
            RECOVERIES.labels(outcome=label).inc()


async def _recover_claimed(
    services: Services, claimed: list[Run], outcomes: list[Outcome]
) -> list[Outcome]:
    for run in claimed:
        log.info("recovering", extra={"run_id": run.id, "action": "recover"})
        try:
            driver = await start_driver(services, run, recovering=True)
            outcomes.append(await _recover(driver))
        except LeaseLost:
            outcomes.append(Outcome(run_id=run.id, kind=StopKind.LEASE_LOST))
        except (FailpointError, asyncio.CancelledError):
            raise
        except Exception:
            # One run's trouble (its scope resolver or downstream is down) must not abort
            # the pass. The run keeps this reaper's lease and goes stale again; it is not
            # released, since a worker would then drive it without reconciling first.
            log.exception("recovery deferred", extra={"run_id": run.id, "action": "recover"})
            outcomes.append(Outcome(run_id=run.id, kind=StopKind.LEASE_LOST, reason="deferred"))
    return outcomes


async def _recover(driver: Driver) -> Outcome:
    calls = pending_tool_calls(driver.messages)
    if calls:
        try:
            stop = await driver.process_call(calls[0])
        except (LeaseLost, FailpointError, asyncio.CancelledError):
            raise
        except Exception as exc:
            return await driver._fail_on_error(exc)
        if stop is not None:
            return stop
    return await driver.release("recovered")


async def reissue_notices(services: Services) -> list[str]:
    """Re-send suspension notices that were never delivered (the process died between the
    durable suspension and the notice, or the webhook was unreachable), each with a fresh
    token. Safe twice: each swap is conditional on the undelivered token's hash."""
    fresh: dict[str, str] = {}

    def new_hash() -> str:
        token = new_token()
        digest = hash_token(token)
        fresh[digest] = token
        return digest

    reissued = await hop(
        services.store.reissue_unnotified,
        older_than_s=services.settings.heartbeat_timeout_s,
        batch=services.settings.reaper_batch,
        new_hashes=new_hash,
    )
    for run, token_hash in reissued:
        token = fresh[token_hash]
        assert run.pending is not None
        await deliver(
            services,
            Notice(
                run_id=run.id,
                user_id=run.user_id,
                token=token,
                approve_url=services.approve_url(token),
                tool=run.pending.tool,
                arguments=run.pending.arguments,
                preview=run.pending.preview,
                expires_at=iso(run.expires_at) or "",
            ),
        )
    return [run.id for run, _ in reissued]


async def continue_run(
    services: Services,
    run_id: str,
    user: str,
    *,
    limits: Limits | dict[str, Any] | None = None,
    why: str | None = None,
) -> Run:
    """Continue a halted run, deliberately: only its owner, only when halted, with an
    explicit grant (SPEC §6 default, or ``limits`` within the configured cap), logged.

    Safe to call twice: the second call finds the run no longer halted (``not_halted``).
    """
    run = await hop(services.store.get_run, inputs.run_id(run_id))
    if run is None or run.user_id != user:
        raise NotFound("no such run")
    if why is not None:
        inputs.text(why, "why", 2000)
    if run.state.value != "halted":
        raise NotHalted(f"the run is {run.state.value}, not halted")
    granted = run.limits.extended() if limits is None else parse_limits(limits, run.limits)
    cap = services.settings.grant_cap
    if (
        granted.max_steps > cap.max_steps
        or granted.max_spend_usd > cap.max_spend_usd
        or granted.max_tool_calls > cap.max_tool_calls
        or granted.max_elapsed_ms > cap.max_elapsed_ms
    ):
        raise InvalidInput("the requested limits exceed the configured cap", cap=cap.to_json())
    continued = await hop(
        services.store.continue_halted,
        run_id=run_id,
        user_id=user,
        limits=granted,
        by=user,
        why=why,
    )
    if continued is None:
        raise NotHalted("the run is no longer halted")
    log.info("continued", extra={"run_id": run_id, "action": "continue", "state": "running"})
    return continued


async def cancel_run(services: Services, run_id: str, user: str) -> Run:
    """Cancel a run that is not terminal. Safe twice: the second call is ``already_finished``."""
    cancelled = await hop(
        services.store.cancel, run_id=inputs.run_id(run_id), user_id=user, by=user
    )
    if cancelled is not None:
        return cancelled
    run = await hop(services.store.get_run, run_id)
    if run is None or run.user_id != user:
        raise NotFound("no such run")
    raise AlreadyFinished(f"the run is already {run.state.value}")


async def expire_suspended(services: Services) -> list[str]:
    """Halt every suspended run past its window (``suspension_expired``). Safe twice: it
    is a conditional UPDATE on ``state = 'suspended'``."""
    expired: list[str] = []
    while True:
        batch = await hop(services.store.expire_suspended, services.settings.purge_batch)
        EXPIRIES.inc(len(batch))
        expired.extend(batch)
        if len(batch) < services.settings.purge_batch:
            return expired


async def purge_retained(services: Services) -> int:
    """Delete runs halted or finished longer ago than the retention, in bounded batches.
    Safe twice: a deleted run is simply not found again."""
    total = 0
    while True:
        count = await hop(
            services.store.purge_retained,
            services.settings.retention_s,
            services.settings.purge_batch,
        )
        total += count
        if count < services.settings.purge_batch:
            return total
