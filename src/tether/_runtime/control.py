"""The other resumptions (SPEC §1-§4): a run whose owner died (the reaper), a halted run
its owner continues, cancellation; and expiry, notice re-issue and retention. Each says
why running it twice is safe. The decision path is in ``decision.py``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from tether import inputs
from tether._runtime.loop import drive, process
from tether._runtime.services import Services, hop
from tether._runtime.session import RunSession
from tether.budget import Limits, parse_limits
from tether.errors import (
    AlreadyFinished,
    DatabaseUnavailable,
    FailpointError,
    InvalidInput,
    LeaseLost,
    NotFound,
    NotHalted,
)
from tether.notify import Notice
from tether.reasons import FailReason
from tether.results import Outcome, StopKind
from tether.runs import Run, RunState, iso
from tether.telemetry import tracing
from tether.telemetry.metrics import EXPIRIES, RECOVERIES
from tether.tokens import hash_token, new_token

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class OrphanClaim:
    """Orphans one reaper took over, and those failed because recovery was exhausted."""

    claimed: list[Run] = field(default_factory=list)
    exhausted: list[str] = field(default_factory=list)

    def filled(self, limit: int) -> bool:
        """Whether the claim took as many orphans as it asked for: more may be waiting."""
        return len(self.claimed) + len(self.exhausted) >= limit


async def carry(services: Services, run: Run, *, stopping: asyncio.Event | None = None) -> Outcome:
    """Start a run this process claimed and drive it to its next stop. A start that fails
    (its scope resolver is down, say) hands the run back with a delay and a
    ``start_failed`` event: it was claimed cleanly, so nothing is left to reconcile, and
    no recovery attempt is spent.

    Safe to run twice: the second start finds the lease moved and is fenced out.
    """
    try:
        session = await RunSession.start(services, run, stopping=stopping)
    except LeaseLost:
        return Outcome(run_id=run.id, kind=StopKind.LEASE_LOST)
    except DatabaseUnavailable:
        # Claimed, then the database went away: a reaper takes it once it is back.
        return Outcome(run_id=run.id, kind=StopKind.ABANDONED)
    except (FailpointError, asyncio.CancelledError):
        raise
    except Exception as exc:
        log.exception("start failed", extra={"run_id": run.id, "action": "start_failed"})
        delay = services.settings.start_retry_s
        await hop(
            services.store.release,
            run.lease(),
            elapsed_ms=0,
            event={"error": f"{type(exc).__name__}: {exc}"[:2000], "retry_in_s": delay},
            delay_s=delay,
            kind="start_failed",
        )
        return Outcome(
            run_id=run.id, kind=StopKind.RELEASED, reason="start_failed", retry_in_s=delay
        )
    return await drive(session)


async def orphan_census(services: Services) -> tuple[float, bool]:
    """The database's clock now and whether any run's owner has a stale heartbeat by it
    (one indexed read, no claim): where a reaper pass starts."""
    return await hop(
        services.store.orphan_census,
        stale_after_s=services.settings.heartbeat_timeout_s,
        versions=services.versions,
    )


async def claim_orphans(
    services: Services, owner: str, limit: int, *, before: float | None = None
) -> OrphanClaim:
    """Take over up to ``limit`` runs whose owner's heartbeat is stale (and older than
    ``before``, a reaper pass's start on the database's clock, so one pass never takes a
    run twice nor spends more than one recovery attempt on it), each with a new lease
    epoch; those past their recovery attempts are failed ``recovery_exhausted`` instead
    (invariant 9).

    Safe to run from two reapers at once: each orphan's claim is conditional on its
    staleness, so only one reaper holds it.
    """
    claimed, exhausted = await hop(
        services.store.claim_orphans,
        owner=owner,
        stale_after_s=services.settings.heartbeat_timeout_s,
        max_attempts=services.settings.max_recovery_attempts,
        batch=limit,
        before=before,
        versions=services.versions,
    )
    RECOVERIES.labels(outcome=FailReason.RECOVERY_EXHAUSTED.value).inc(len(exhausted))
    return OrphanClaim(claimed=claimed, exhausted=exhausted)


async def recover(services: Services, run: Run) -> Outcome:
    """Reconcile the call of a claimed orphan that may have run without its result being
    stored (invariant 3), then hand the run back to the workers.

    Safe to run twice: a reaper that loses the lease mid-way is fenced out, and
    reconciliation only reads by key or re-issues under the same key.
    """
    log.info("recovering", extra={"run_id": run.id, "action": "recover"})
    try:
        outcome = await _recover(services, run)
    except LeaseLost:
        outcome = Outcome(run_id=run.id, kind=StopKind.LEASE_LOST)
    except (FailpointError, asyncio.CancelledError):
        raise
    except Exception:
        # The run's scope resolver or downstream is down. It keeps this reaper's lease and
        # goes stale again; it is not released, since a worker would then drive it
        # without reconciling first.
        log.exception("recovery deferred", extra={"run_id": run.id, "action": "recover"})
        outcome = Outcome(run_id=run.id, kind=StopKind.LEASE_LOST, reason="deferred")
    label = outcome.reason if outcome.kind is StopKind.FAILED else outcome.kind.value
    RECOVERIES.labels(outcome=label or "failed").inc()
    return outcome


async def _recover(services: Services, run: Run) -> Outcome:
    """The recovery, traced as the run's stretch in this process (``tracing.py``)."""
    with tracing.stretch(run.id, run.trace_context, services.agent.name, "recover") as span:
        outcome = await _recovering(services, run)
        span.stopped(outcome)
        return outcome


async def _recovering(services: Services, run: Run) -> Outcome:
    session = await RunSession.start(services, run, recovering=True)
    try:
        pending = session.pending_calls()
        if pending:
            try:
                stop = await process(session, pending[0])
            except (LeaseLost, DatabaseUnavailable, FailpointError, asyncio.CancelledError):
                raise
            except Exception as exc:
                return await session.fail_on_error(exc)
            if stop is not None:
                return stop
        return await session.release("recovered")
    finally:
        session.close()


async def recover_orphans(services: Services, owner: str) -> list[Outcome]:
    """One reaper pass over stale runs (``tether reap``): claim a batch of
    ``reaper_batch``, recover it concurrently (none waits behind another long enough to
    go stale again), and go on with the next batch until no orphan that was stale when
    the pass began is left. Safe twice (see ``claim_orphans``); bounded, since a run the
    pass claimed has a fresh heartbeat and is never taken again by the same pass."""
    began, _ = await orphan_census(services)
    batch = services.settings.reaper_batch
    outcomes: list[Outcome] = []
    while True:
        claim = await claim_orphans(services, owner, batch, before=began)
        outcomes.extend(
            Outcome(run_id=run_id, kind=StopKind.FAILED, reason=FailReason.RECOVERY_EXHAUSTED.value)
            for run_id in claim.exhausted
        )
        outcomes.extend(await asyncio.gather(*(recover(services, run) for run in claim.claimed)))
        if not claim.filled(batch):
            return outcomes


async def reissue_notices(services: Services) -> list[str]:
    """Re-send suspension notices that were never delivered (the process died between the
    durable suspension and the notice, or the webhook was unreachable), each with a fresh
    token. Only once a notice's delivery window (``notice_timeout_s``) has closed: the
    outbox never sends a notice later than that, so a re-issue never races the notice it
    replaces. Safe twice: each swap is conditional on the undelivered token's hash."""
    fresh: dict[str, str] = {}

    def new_hash() -> str:
        token = new_token()
        fresh[hash_token(token)] = token
        return hash_token(token)

    reissued = await hop(
        services.store.reissue_unnotified,
        older_than_s=max(services.settings.heartbeat_timeout_s, services.settings.notice_timeout_s),
        batch=services.settings.reaper_batch,
        new_hashes=new_hash,
        versions=services.versions,
    )
    for run, token_hash in reissued:
        token = fresh[token_hash]
        assert run.pending is not None
        notice = Notice(
            run_id=run.id,
            user_id=run.user_id,
            token=token,
            approve_url=services.approve_url(token),
            tool=run.pending.tool,
            arguments=run.pending.arguments,
            preview=run.pending.preview,
            expires_at=iso(run.expires_at) or "",
        )
        await services.outbox.post(notice)
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
    if run.state is not RunState.HALTED:
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
    grant = {"tether.continue.by": user, "tether.continue.halt_reason": run.halt_reason}
    with tracing.action("continue_run", run.id, run.trace_context, grant):
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
        batch = await hop(
            services.store.expire_suspended,
            services.settings.purge_batch,
            versions=services.versions,
        )
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
