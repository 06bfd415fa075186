"""Recovering runs whose owner died (the reaper): claiming orphans, reconciling each, and
handing it back to the workers. Each says why running it twice is safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step.loop import batches, carry_session, process_group
from tether._runtime.step.session import RunSession
from tether.errors import (
    DatabaseUnavailable,
    FailpointError,
    LeaseLost,
)
from tether.reasons import FailReason
from tether.results import Outcome, StopKind
from tether.runs import Run
from tether.telemetry import tracing
from tether.telemetry.content import failure
from tether.telemetry.metrics import RECOVERIES

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class OrphanClaim:
    """Orphans one reaper took over, and those failed because recovery was exhausted."""

    claimed: list[Run] = field(default_factory=list)
    exhausted: list[str] = field(default_factory=list)

    def filled(self, limit: int) -> bool:
        """Whether the claim took as many orphans as it asked for: more may be waiting."""
        return len(self.claimed) + len(self.exhausted) >= limit


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


async def recover(
    services: Services,
    run: Run,
    *,
    carry_on: bool = False,
    stopping: asyncio.Event | None = None,
    reconciled: Callable[[], None] | None = None,
) -> Outcome:
    """Reconcile the call of a claimed orphan that may have run without its result being
    stored (invariant 3), then hand the run back to the workers; with ``carry_on`` (a
    worker that claimed it into one of its slots) carry it on to its next stop instead, on
    the session the reconciliation read, so the run's history is read once, not again by
    a claim after a hand-back. ``reconciled`` is called once it is carried on.

    Safe to run twice: a reaper that loses the lease mid-way is fenced out, and
    reconciliation only reads by key or re-issues under the same key.
    """
    log.info("recovering", extra={"run_id": run.id, "action": "recover"})
    try:
        found = await _recover(services, run, carry_on=carry_on, stopping=stopping)
    except LeaseLost:
        found = Outcome(run_id=run.id, kind=StopKind.LEASE_LOST)
    except (FailpointError, asyncio.CancelledError):
        raise
    except Exception as exc:
        # The run's scope resolver or downstream is down. It keeps this reaper's lease and
        # goes stale again; it is not released, since a worker would then drive it
        # without reconciling first.
        allowed = services.settings.log_content
        log.error("recovery deferred", **failure(exc, allowed, run_id=run.id, action="recover"))
        found = Outcome(run_id=run.id, kind=StopKind.LEASE_LOST, reason="deferred")
    if isinstance(found, RunSession):  # reconciled, its history in hand: carried on here
        RECOVERIES.labels(outcome=CARRIED).inc()
        if reconciled is not None:
            reconciled()
        return await carry_session(found)
    label = found.reason if found.kind is StopKind.FAILED else found.kind.value
    RECOVERIES.labels(outcome=label or "failed").inc()
    return found


# The ``tether_recoveries`` outcome of an orphan its worker reconciled and carried on.
CARRIED = "carried"


async def _released(session: RunSession) -> Outcome:
    try:
        return await session.release("recovered")
    finally:
        session.close()


async def _recover(
    services: Services, run: Run, *, carry_on: bool, stopping: asyncio.Event | None
) -> Outcome | RunSession:
    """The recovery, traced as the run's stretch in this process (``tracing.py``): how it
    stopped (handed back, unless ``carry_on``), or the session of a run reconciled and
    ready to go on."""
    allowed = services.settings.otel_content
    agent = services.agent.name
    with tracing.stretch(run.id, run.trace_context, agent, "recover", content=allowed) as span:
        found = await _recovering(services, run, stopping=stopping if carry_on else None)
        if isinstance(found, RunSession) and not carry_on:
            found = await _released(found)
        if isinstance(found, RunSession):
            span.set("tether.run.outcome", "reconciled")
        else:
            span.stopped(found)
        return found


async def _recovering(
    services: Services, run: Run, *, stopping: asyncio.Event | None
) -> Outcome | RunSession:
    session = await RunSession.start(services, run, recovering=True, stopping=stopping)
    kept = False
    try:
        pending = session.pending_calls()
        if pending:
            try:
                # The first group of calls that ran together: each write of it may
                # have run before the crash, and is reconciled by its key.
                stop = await process_group(session, batches(session, pending)[0])
            except (LeaseLost, DatabaseUnavailable, FailpointError, asyncio.CancelledError):
                raise
            except Exception as exc:
                return await session.fail_on_error(exc)
            if stop is not None:
                return stop
        kept = True  # the caller hands it back or carries it on, and closes it
        return session
    finally:
        if not kept:
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
