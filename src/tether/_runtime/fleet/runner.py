"""The worker's runner: what a ``Worker`` does with one engine's parts, apart from the
Engine that applications and the HTTP layer call (as procrastinate's worker owns its job
manager). It claims ready runs and orphans, carries and recovers them, and does the
reaper's upkeep, always for the agent versions this process serves.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

from tether import inputs
from tether._runtime.fleet import escalations, recovery, schedules, upkeep
from tether._runtime.fleet.recovery import OrphanClaim
from tether._runtime.fleet.versions import Registration
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step.loop import carry
from tether.config import Settings
from tether.results import Outcome, ReapReport, StopKind
from tether.runs import Run
from tether.store import Store
from tether.store.backend.listen import listen


def new_worker_id() -> str:
    """A unique owner name for this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Runner:
    """Claims, carrying, recovery and upkeep for one engine, owned by its ``Worker``.

    ``opened`` checks the schema once (the engine's ``open``); every call that reaches the
    database awaits it first, so a runner works on an engine nobody opened yet.
    """

    def __init__(
        self,
        services: Services,
        worker_id: str | None,
        opened: Callable[[], Awaitable[None]],
    ) -> None:
        self.services = services
        self.worker_id = worker_id or new_worker_id()  # the owner name its claims carry
        self._opened = opened

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def store(self) -> Store:
        return self.services.store

    @property
    def notifies(self) -> bool:
        """Whether the store wakes idle workers (PostgreSQL's NOTIFY) rather than their
        polling."""
        return self.services.store.dialect.notifies

    def listener(self, on_ready: Callable[[], None]) -> Callable[[], Awaitable[None]] | None:
        """The body of a task that calls ``on_ready`` at each ready-run notice (PostgreSQL's
        ``LISTEN``); None where the store sends none, and idle workers poll."""
        dsn = self.services.store.listen_dsn()
        if dsn is None:
            return None
        return lambda: listen(dsn, lambda _payload: on_ready())

    def registration(self) -> Registration:
        """This process's entry in the registry of live workers and their versions."""
        return Registration(self.services, self.worker_id)

    async def claim(self, run_id: str | None = None) -> Run | None:
        """Take the lease of ``run_id`` (or of the run that has waited longest) if it waits
        for a worker of a version this process serves."""
        await self._opened()
        wanted = None if run_id is None else inputs.run_id(run_id)
        return await hop(
            self.services.store.claim_ready,
            self.worker_id,
            wanted,
            versions=self.services.versions,
            cap=self.services.settings.max_active_per_user,
        )

    async def claim_many(self, limit: int) -> list[Run]:
        """Take the leases of up to ``limit`` of the runs that wait longest (best first, as
        ``claim`` takes one) for a worker of a version this process serves, in one
        transaction; under ``TETHER_MAX_ACTIVE_PER_USER`` one at most."""
        await self._opened()
        return await hop(
            self.services.store.claim_waiting,
            self.worker_id,
            limit,
            versions=self.services.versions,
            cap=self.services.settings.max_active_per_user,
        )

    async def next_start_in(self) -> float | None:
        """Seconds until a queued run's start time comes, by the database's clock (None:
        no run waits for one), so an idle worker wakes for it rather than at its poll."""
        await self._opened()
        return await hop(self.services.store.next_start_in)

    async def fire_schedules(self) -> tuple[int, float | None]:
        """Fire the schedules due now (``schedules.fire_due``) and escalate the calls due
        now (``escalations.escalate_due``, reference §19): the runs started, and the
        seconds until the next tick of any schedule or the next escalation (None: none)."""
        await self._opened()
        fired = await schedules.fire_due(self.services)
        await escalations.escalate_due(self.services)
        store = self.services.store
        escalating = await hop(store.next_escalation_in, self.services.versions)
        due = [await hop(store.next_tick_in), escalating]
        known = [d for d in due if d is not None]
        return fired, min(known) if known else None

    async def carry(self, run: Run, *, stopping: asyncio.Event | None = None) -> Outcome:
        """Carry a run this process claimed to its next stop (see ``loop.carry``)."""
        return await carry(self.services, run, stopping=stopping)

    async def claim_orphans(self, limit: int, *, before: float | None = None) -> OrphanClaim:
        """Take over up to ``limit`` runs whose owner's heartbeat is stale (and older than
        ``before``, on the database's clock, if given)."""
        await self._opened()
        return await recovery.claim_orphans(self.services, self.worker_id, limit, before=before)

    async def orphan_census(self) -> tuple[float, bool]:
        """The database's clock now and whether any run's owner has a stale heartbeat."""
        await self._opened()
        return await recovery.orphan_census(self.services)

    async def recover(
        self,
        run: Run,
        *,
        carry_on: bool = False,
        stopping: asyncio.Event | None = None,
        reconciled: Callable[[], None] | None = None,
    ) -> Outcome:
        """Reconcile one claimed orphan and hand it back to the workers, or, with
        ``carry_on``, carry it on to its next stop (see ``recovery.recover``)."""
        return await recovery.recover(
            self.services, run, carry_on=carry_on, stopping=stopping, reconciled=reconciled
        )

    async def recover_orphans(self) -> list[Outcome]:
        """One reaper pass over runs whose owner's heartbeat is stale."""
        await self._opened()
        return await recovery.recover_orphans(self.services, self.worker_id)

    async def expire_suspended(self) -> list[str]:
        """Halt suspended runs whose approval window has passed."""
        await self._opened()
        return await upkeep.expire_suspended(self.services)

    async def reissue_notices(self) -> list[str]:
        """Re-send suspension notices that were never delivered, with fresh tokens."""
        await self._opened()
        return await upkeep.reissue_notices(self.services)

    async def purge_retained(self) -> int:
        """Delete runs kept past the retention."""
        await self._opened()
        return await upkeep.purge_retained(self.services)

    async def reap(self) -> ReapReport:
        """One reaper pass: recover orphans, expire suspensions, re-send undelivered
        notices, purge past retention."""
        recovered = await self.recover_orphans()
        return ReapReport(
            recovered=[o.run_id for o in recovered if o.kind is StopKind.RELEASED],
            stopped={o.run_id: o.kind.value for o in recovered if o.kind is not StopKind.RELEASED},
            expired=await self.expire_suspended(),
            escalated=await escalations.escalate_due(self.services),
            notices_reissued=await self.reissue_notices(),
            purged=await self.purge_retained(),
        )
