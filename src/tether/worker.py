"""The worker: a claim loop that carries up to ``concurrency`` runs at once, beside side
tasks under a monitor, the way procrastinate's worker runs its heartbeat beside its loop.

Side tasks: the reaper (orphans, expiry, retention) and the notice re-issue, each on its
own ``reaper_interval_s`` timer, so a webhook that never answers delays neither claiming
nor recovery; the registry heartbeat, which keeps the agent versions this worker serves
listed as served (reference §12: runs of no served version are stranded); on PostgreSQL, a
listener that wakes the claim loop on ``NOTIFY tether_runs``. The monitor logs a side
task that died and restarts it after a backoff; none dies silently. The claim loop is the
worker itself: a claim that fails (the database went away) is logged and tried again
after a backoff, so the worker outlives a dropped connection, a restart or an outage of
its database.

A reaper pass recovers orphans in bulk: it claims them in batches into the slots as they
free, each recovery a task of its own that, once the orphan is reconciled, carries it on in
its slot (its history read once, not again by a claim after a hand-back), until no orphan
that was stale when the pass began is left, so a thousand orphans take one pass, and none
waits claimed without a slot (where its heartbeat would go stale again). The fair rule for
the slots: while runs wait for a worker, recoveries hold at most ``orphan_share`` of them,
all but a quarter (runs keep at least one slot when there are two or more), and the claim
loop leaves a pass what it is owed of that share; when no run waits, recoveries may take
every free slot. Orphans thus go first (with one slot, before any new run), yet a burst of
them never stops the queue. A pass holds no slot while nothing can be claimed: it keeps
freed slots back only for the one read that tells whether any orphan is stale, and then
while orphans are known to be left; it ends on ``stop()``, on a batch that came back short,
or when no slot freed for a whole interval.

``stop()`` (SIGTERM) stops claiming; each run in hand is handed back at its next step
boundary, the side tasks end, and ``run()`` returns. Memory stays bounded however long
the worker lives: it keeps counters, never the outcomes themselves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from tether._runtime.fleet.recovery import OrphanClaim
from tether._runtime.fleet.versions import Registration
from tether.engine import Engine
from tether.runs import Run
from tether.telemetry.content import failure

log = logging.getLogger(__name__)

# A dead side task is restarted after RESTART_FIRST_S, doubling up to RESTART_MAX_S; one
# that had run longer than RESTART_MAX_S before dying starts again from the first delay.
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
# Side tasks whose pass may be abandoned on stop: re-issue is safe to cut short (a notice
# left undelivered is re-issued later) and the listener only wakes the loop. The reaper
# ends its pass after the batch in flight, so that orphans it claimed are recovered, not
# left to go stale.
CANCEL_ON_STOP = frozenset({"notices", "listener"})
# The most runs one claim takes (one transaction): a worker with a thousand free slots
# fills them in tens of claims, not a thousand (benchmarks/capacity.py).
CLAIM_BATCH = 32


class Worker:
    """Carries up to ``concurrency`` runs at once on one engine, with the reaper, the
    notice re-issue and the PostgreSQL listener beside it."""

    def __init__(
        self, engine: Engine, *, concurrency: int = 8, poll_s: float | None = None
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.engine = engine
        self._runner = engine.runner  # the plumbing of claims and upkeep (tether._runtime)
        self.concurrency = concurrency
        # Where the store wakes workers by NOTIFY, the poll is only a fallback.
        notifies = engine.runner.notifies
        self.poll_s = poll_s if poll_s is not None else (5.0 if notifies else 0.25)
        self.stopping = asyncio.Event()
        # How the runs this worker handled stopped (StopKind values, "error") and how
        # often each side task was restarted: bounded key sets, so a long-lived serve
        # keeps counters, never a history.
        self.counts: collections.Counter[str] = collections.Counter()
        self.restarts: collections.Counter[str] = collections.Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reserved = 0  # slots held while a claim (of a run or orphans) is in flight
        # The fair rule (module docstring): the most slots recoveries hold while runs wait.
        self.orphan_share = max(1, concurrency - max(1, concurrency // 4))
        self._recovering = 0  # the tasks of ``_tasks`` that recover an orphan
        self._claiming_orphans = 0  # slots reserved for a claim of orphans in flight
        self._runs_waiting = True  # runs wait for a worker, as the claim loop last saw
        self._orphans_left = False  # a reaper pass is under way and orphans are left
        self._wake = asyncio.Event()  # a run may be waiting, or a slot freed
        self._freed = asyncio.Event()  # a slot freed (the reaper waits on it)
        self._reaped = asyncio.Event()  # the first reaper pass was attempted
        self._ticked = asyncio.Event()  # the first pass over the schedules was attempted
        # Whether its log lines may carry content: messages of errors (TETHER_LOG_CONTENT).
        self._content = engine.runner.settings.log_content

    def stop(self) -> None:
        """Stop claiming; runs in hand are handed back at their next step boundary."""
        self.stopping.set()
        self._wake.set()
        self._freed.set()

    async def run(self, *, exit_when_idle: bool = False, reap: bool = True) -> None:
        """Claim and carry runs until stopped (or, with ``exit_when_idle``, until no run
        waits and none is in hand, after a first reaper pass)."""
        if not reap:
            self._reaped.set()
            self._ticked.set()
        registration = self._runner.registration()
        side = self._side_tasks(reap)
        side["registry"] = lambda: self._beat(registration)
        monitors = {
            name: asyncio.create_task(self._supervise(name, body), name=f"tether-{name}")
            for name, body in side.items()
        }
        try:
            await self._claim_loop(exit_when_idle)
        finally:
            self.stop()
            for name, task in monitors.items():
                if name in CANCEL_ON_STOP:
                    task.cancel()
            await asyncio.gather(*monitors.values(), return_exceptions=True)
            while self._tasks:  # the reaper may have added recoveries while it finished
                await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):  # else its rows go stale, which is as good
                await registration.leave()

    def _side_tasks(self, reap: bool) -> dict[str, Callable[[], Awaitable[None]]]:
        side: dict[str, Callable[[], Awaitable[None]]] = {}
        if reap:
            side["reaper"] = self._reaper
            side["notices"] = self._notices
            side["schedules"] = self._schedules
        listener = self._runner.listener(self._announced)
        if listener is not None:
            side["listener"] = listener
        return side

    # -- the claim loop --------------------------------------------------------------------

    async def _claim_loop(self, exit_when_idle: bool) -> None:
        delay = RESTART_FIRST_S
        while not self.stopping.is_set():
            self._wake.clear()
            try:
                if await self._fill():
                    delay = RESTART_FIRST_S
                    continue
            except Exception as exc:
                # The database went away (or a claim failed otherwise): the runs in hand go
                # on, and claiming resumes after a backoff. The worker never dies of it.
                self.counts["claim_error"] += 1
                log.error(
                    "claiming failed; retrying",
                    **failure(exc, self._content, action="claim", retry_in_s=delay),
                )
                await self._pause(delay)
                delay = min(delay * 2, RESTART_MAX_S)
                continue
            delay = RESTART_FIRST_S
            idle = not self._tasks and not self._reserved and self._reaped.is_set()
            # A run that ended during the claim may have made another due: ``_wake`` says.
            idle = idle and self._ticked.is_set() and not self._wake.is_set()
            if exit_when_idle and idle:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=await self._idle_for())
            except TimeoutError:
                self._runs_waiting = True  # the poll: a run may have come meanwhile

    async def _idle_for(self) -> float:
        """How long an idle claim loop waits unless woken: its poll interval, or less when
        a queued run's start time comes sooner (reference §13)."""
        if self._free() <= 0:
            return self.poll_s
        try:
            due = await self._runner.next_start_in()
        except Exception:  # the database went away: the next claim says so
            return self.poll_s
        return self.poll_s if due is None else min(self.poll_s, max(due, 0.01))

    def _free(self) -> int:
        return self.concurrency - len(self._tasks) - self._reserved

    def _room_for_runs(self) -> int:
        """Free slots the claim loop may fill: all but what a reaper pass is owed."""
        owed = 0
        if self._orphans_left:
            owed = max(0, self.orphan_share - self._recovering - self._claiming_orphans)
        return self._free() - owed

    def _room_for_orphans(self) -> int:
        """Free slots a reaper pass may claim orphans into now (the fair rule)."""
        room = self._free()
        if self._runs_waiting:
            room = min(room, self.orphan_share - self._recovering)
        return max(0, room)

    async def _fill(self) -> bool:
        """Claim runs into the free slots (leaving a reaper pass its share), up to
        ``CLAIM_BATCH`` in each transaction; True if any. Finding none waiting lets a
        reaper pass have every free slot."""
        claimed = False
        while (room := self._room_for_runs()) > 0 and not self.stopping.is_set():
            limit = min(room, CLAIM_BATCH)
            self._reserved += limit  # the slots are taken while the claim is in flight
            try:
                runs = await self._runner.claim_many(limit)
            finally:
                self._reserved -= limit
            for run in runs:
                claimed = True
                self._spawn(self._carry(run), run)
            if not runs:
                self._runs_waiting = False
                self._freed.set()
                break
            self._runs_waiting = True
        return claimed

    def _spawn(self, work: Coroutine[Any, Any, None], run: Run) -> None:
        task = asyncio.create_task(work, name=f"tether-run-{run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()
        self._freed.set()

    async def _carry(self, run: Run, *, orphan: bool = False) -> None:
        """Carry a claimed run to its next stop. An ``orphan`` is reconciled first and then
        carried on in its slot (its history read once, not again by a claim after a
        hand-back); until it is reconciled it counts as a recovery (the fair rule)."""
        recovering = orphan

        def reconciled() -> None:
            nonlocal recovering
            recovering = False
            self._recovering -= 1

        try:
            if orphan:
                outcome = await self._runner.recover(
                    run, carry_on=True, stopping=self.stopping, reconciled=reconciled
                )
            else:
                outcome = await self._runner.carry(run, stopping=self.stopping)
        except Exception as exc:
            self.counts["error"] += 1
            action = "recover" if orphan else "carry"
            told = failure(exc, self._content, run_id=run.id, action=action)
            log.error("recovery failed" if orphan else "carrying a run failed", **told)
            return
        finally:
            if recovering:
                self._recovering -= 1
        self.counts[outcome.kind.value] += 1
        if outcome.retry_in_s is not None:
            # Handed back with a delay: no NOTIFY marks the moment it is ready again.
            asyncio.get_running_loop().call_later(outcome.retry_in_s, self._wake.set)
        said = {"run_id": run.id, "state": outcome.kind.value}
        if orphan:
            log.info("orphan recovered", extra={**said, "action": "recover"})
        else:
            log.info("run stopped", extra={**said, "action": "carry", "reason": outcome.reason})

    # -- the monitor -------------------------------------------------------------------------

    async def _supervise(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run a side task until stop; log it and restart it after a backoff whenever it
        dies (or returns early), so none stops silently."""
        delay = RESTART_FIRST_S
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                await body()
                if self.stopping.is_set():
                    return
                log.error(
                    "side task returned before stop; restarting",
                    extra={"action": "side_task_restart", "task": name, "retry_in_s": delay},
                )
            except Exception as exc:
                if time.monotonic() - started > RESTART_MAX_S:
                    delay = RESTART_FIRST_S  # it had been healthy: a fresh failure
                log.error(
                    "side task failed; restarting",
                    **failure(
                        exc,
                        self._content,
                        action="side_task_restart",
                        task=name,
                        retry_in_s=delay,
                        restarts=self.restarts[name] + 1,
                    ),
                )
            self.restarts[name] += 1
            await self._pause(delay)
            delay = min(delay * 2, RESTART_MAX_S)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the worker stops."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

    # -- side tasks --------------------------------------------------------------------------

    async def _reaper(self) -> None:
        """Every ``reaper_interval_s``: recover orphans into the slots, expire suspensions
        past their window, purge runs past retention."""
        while not self.stopping.is_set():
            try:
                recovered = await self._recover_orphans()
                expired = await self._runner.expire_suspended()
                purged = await self._runner.purge_retained()
            finally:
                if not self._reaped.is_set():
                    self._reaped.set()
                    self._wake.set()  # an idle ``exit_when_idle`` loop may exit now
            if recovered or expired or purged:
                log.info(
                    "reaped",
                    extra={
                        "action": "reap",
                        "recovered": recovered,
                        "expired": len(expired),
                        "purged": purged,
                    },
                )
            await self._pause(self._runner.settings.reaper_interval_s)

    async def _schedules(self) -> None:
        """Fire the schedules' due ticks (reference §13), then sleep until the next tick
        by the database's clock, at most one reaper interval (a catch-up after downtime
        starts within one), or until this process adds a schedule."""
        added = self._runner.services.schedules_added
        while not self.stopping.is_set():
            added.clear()
            try:
                fired, next_in = await self._runner.fire_schedules()
            finally:
                if not self._ticked.is_set():
                    self._ticked.set()
                    self._wake.set()  # an idle ``exit_when_idle`` loop may exit now
            if fired:
                self._wake.set()  # their runs wait for a slot here too
            wait = self._runner.settings.reaper_interval_s
            if next_in is not None:
                wait = min(wait, next_in)
            with contextlib.suppress(asyncio.TimeoutError):
                stop = asyncio.ensure_future(self.stopping.wait())
                woken = asyncio.ensure_future(added.wait())
                try:
                    await asyncio.wait_for(
                        asyncio.wait({stop, woken}, return_when=asyncio.FIRST_COMPLETED),
                        timeout=max(wait, 0.01),
                    )
                finally:
                    stop.cancel()
                    woken.cancel()

    async def _recover_orphans(self) -> int:
        """One reaper pass over the orphans: batches claimed into the slots as they free
        (the fair rule of the module docstring), each orphan recovered as a task of this
        worker, until no orphan that was stale when the pass began is left; the number
        claimed. Safe beside other reapers: each orphan's claim is conditional on its
        staleness and gives a new lease epoch, so only one of them recovers it; and a run
        claimed by this pass has a fresh heartbeat, so the pass takes it at most once."""
        # Until the census answers, a slot that frees is kept for this pass (orphans go
        # before new runs); after it, only while orphans are known to be left.
        self._orphans_left = True
        claimed = 0
        try:
            began, self._orphans_left = await self._runner.orphan_census()
            while self._orphans_left and not self.stopping.is_set():
                room = self._room_for_orphans() or await self._wait_for_room()
                if room <= 0:
                    break
                limit = min(room, self._runner.settings.reaper_batch)
                claim = await self._claim_batch(limit, began)
                claimed += len(claim.claimed)
                self._orphans_left = claim.filled(limit)
        finally:
            self._orphans_left = False
            self._wake.set()  # the claim loop may have left slots free for this pass
        return claimed

    async def _claim_batch(self, limit: int, began: float) -> OrphanClaim:
        """Claim up to ``limit`` orphans into as many slots and start their recoveries."""
        self._reserved += limit
        self._claiming_orphans += limit
        try:
            claim = await self._runner.claim_orphans(limit, before=began)
        finally:
            self._reserved -= limit
            self._claiming_orphans -= limit
            self._wake.set()  # slots the orphans did not take go back to the claim loop
        for run in claim.claimed:
            self._recovering += 1
            self._spawn(self._carry(run, orphan=True), run)
        for run_id in claim.exhausted:
            self.counts["failed"] += 1
            log.warning(
                "recovery attempts exhausted",
                extra={"run_id": run_id, "action": "recover", "state": "failed"},
            )
        return claim

    async def _wait_for_room(self) -> int:
        """Wait until the fair rule gives orphans a slot (the claim loop leaves freed
        slots to this pass meanwhile); 0 on stop or if none came within an interval."""
        deadline = time.monotonic() + self._runner.settings.reaper_interval_s
        while not self.stopping.is_set():
            room = self._room_for_orphans()
            left = deadline - time.monotonic()
            if room > 0 or left <= 0:
                return room
            self._freed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._freed.wait(), timeout=left)
        return 0

    async def _notices(self) -> None:
        """Every ``reaper_interval_s``: re-send undelivered suspension notices. Its own
        task, so a webhook that never answers stalls nothing else."""
        while not self.stopping.is_set():
            reissued = await self._runner.reissue_notices()
            if reissued:
                log.info("notices reissued", extra={"action": "reissue", "runs": reissued})
            await self._pause(self._runner.settings.reaper_interval_s)

    async def _beat(self, registration: Registration) -> None:
        """Keep this worker's row in the registry fresh, so the versions it serves count
        as served (reference §12); a clean stop removes it (``run``)."""
        await registration.join()
        while not self.stopping.is_set():
            await self._pause(registration.interval_s)
            if not self.stopping.is_set():
                await registration.beat()

    def _announced(self) -> None:
        """A run became ready somewhere (NOTIFY): runs wait; wake the claim loop."""
        self._runs_waiting = True
        self._wake.set()
