"""The worker: a claim loop that carries up to ``concurrency`` runs at once, beside side
tasks under a monitor, the way procrastinate's worker runs its heartbeat beside its loop.

Side tasks: the reaper (orphans, expiry, retention) and the notice re-issue, each on its
own ``reaper_interval_s`` timer, so a webhook that never answers delays neither claiming
nor recovery; on PostgreSQL, a listener that wakes the claim loop on ``NOTIFY
tether_runs``. The monitor logs a side task that died and restarts it after a backoff;
none dies silently. The claim loop is the worker itself: a claim that fails (the database
went away) is logged and tried again after a backoff, so the worker outlives a dropped
connection, a restart or an outage of its database.

``stop()`` (SIGTERM) stops claiming; each run in hand is handed back at its next step
boundary, the side tasks end, and ``run()`` returns. Memory stays bounded however long
the worker lives: it keeps counters, never the outcomes themselves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from tether.engine import Engine
from tether.errors import DatabaseUnavailable
from tether.runs import Run
from tether.store.dialect import CHANNEL

log = logging.getLogger(__name__)

# A dead side task is restarted after RESTART_FIRST_S, doubling up to RESTART_MAX_S; one
# that had run longer than RESTART_MAX_S before dying starts again from the first delay.
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
# Side tasks whose pass may be abandoned on stop: re-issue is safe to cut short (a notice
# left undelivered is re-issued later) and the listener only wakes the loop. The reaper
# finishes its pass, so that orphans it claimed are recovered, not left to go stale.
CANCEL_ON_STOP = frozenset({"notices", "listener"})


class Worker:
    """Carries up to ``concurrency`` runs at once on one engine, with the reaper, the
    notice re-issue and the PostgreSQL listener beside it."""

    def __init__(
        self, engine: Engine, *, concurrency: int = 8, poll_s: float | None = None
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.engine = engine
        self.concurrency = concurrency
        # Where the store wakes workers by NOTIFY, the poll is only a fallback.
        notifies = engine.store.dialect.notifies
        self.poll_s = poll_s if poll_s is not None else (5.0 if notifies else 0.25)
        self.stopping = asyncio.Event()
        # How the runs this worker handled stopped (StopKind values, "error") and how
        # often each side task was restarted: bounded key sets, so a long-lived serve
        # keeps counters, never a history.
        self.counts: collections.Counter[str] = collections.Counter()
        self.restarts: collections.Counter[str] = collections.Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reserved = 0  # slots held while a claim (of a run or orphans) is in flight
        self._reaper_waiting = False  # the reaper wants the next slot that frees
        self._wake = asyncio.Event()  # a run may be waiting, or a slot freed
        self._freed = asyncio.Event()  # a slot freed (the reaper waits on it)
        self._reaped = asyncio.Event()  # the first reaper pass was attempted

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
        side = self._side_tasks(reap)
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

    def _side_tasks(self, reap: bool) -> dict[str, Callable[[], Awaitable[None]]]:
        side: dict[str, Callable[[], Awaitable[None]]] = {}
        if reap:
            side["reaper"] = self._reaper
            side["notices"] = self._notices
        dsn = self.engine.store.listen_dsn()
        if dsn is not None:
            side["listener"] = lambda: self._listener(dsn)
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
                    exc_info=not isinstance(exc, DatabaseUnavailable),
                    extra={
                        "action": "claim",
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                        "retry_in_s": delay,
                    },
                )
                await self._pause(delay)
                delay = min(delay * 2, RESTART_MAX_S)
                continue
            delay = RESTART_FIRST_S
            idle = not self._tasks and not self._reserved and self._reaped.is_set()
            if exit_when_idle and idle:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)

    def _free(self) -> int:
        return self.concurrency - len(self._tasks) - self._reserved

    async def _fill(self) -> bool:
        """Claim runs into the free slots (leaving one to a waiting reaper); True if any."""
        claimed = False
        while self._free() - self._reaper_waiting > 0 and not self.stopping.is_set():
            self._reserved += 1  # the slot is taken while the claim is in flight
            try:
                run = await self.engine.claim_next()
            finally:
                self._reserved -= 1
            if run is None:
                break
            claimed = True
            self._spawn(self._carry(run), run)
        return claimed

    def _spawn(self, work: Coroutine[Any, Any, None], run: Run) -> None:
        task = asyncio.create_task(work, name=f"tether-run-{run.id}")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()
        self._freed.set()

    async def _carry(self, run: Run) -> None:
        try:
            outcome = await self.engine.carry(run, stopping=self.stopping)
        except Exception:
            self.counts["error"] += 1
            log.exception("carrying a run failed", extra={"run_id": run.id, "action": "carry"})
            return
        self.counts[outcome.kind.value] += 1
        if outcome.reason == "start_failed":
            # Handed back with a delay: no NOTIFY marks the moment it is ready again.
            retry_s = self.engine.settings.start_retry_s
            asyncio.get_running_loop().call_later(retry_s, self._wake.set)
        log.info(
            "run stopped",
            extra={
                "run_id": run.id,
                "action": "carry",
                "state": outcome.kind.value,
                "reason": outcome.reason,
            },
        )

    async def _recover(self, run: Run) -> None:
        try:
            outcome = await self.engine.recover(run)
        except Exception:
            self.counts["error"] += 1
            log.exception("recovery failed", extra={"run_id": run.id, "action": "recover"})
            return
        self.counts[outcome.kind.value] += 1
        log.info(
            "orphan recovered",
            extra={"run_id": run.id, "action": "recover", "state": outcome.kind.value},
        )

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
                log.exception(
                    "side task failed; restarting",
                    extra={
                        "action": "side_task_restart",
                        "task": name,
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                        "retry_in_s": delay,
                        "restarts": self.restarts[name] + 1,
                    },
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
        """Every ``reaper_interval_s``: recover orphans into free slots, expire suspensions
        past their window, purge runs past retention."""
        while not self.stopping.is_set():
            try:
                recovered = await self._claim_orphans()  # waits up to an interval for a slot
                expired = await self.engine.expire_suspended()
                purged = await self.engine.purge_retained()
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
            await self._pause(self.engine.settings.reaper_interval_s)

    async def _claim_orphans(self) -> int:
        """Claim at most as many orphans as there are free slots and recover each as a
        task of this worker, so none waits behind another and goes stale again. Orphans
        go before new runs: with no slot free, the next one that frees is held for them
        (for up to one interval). Safe beside other reapers: each orphan's claim is one
        conditional UPDATE with a new lease epoch, so only one of them recovers it."""
        free = await self._slots_for_orphans()
        if free <= 0:
            return 0
        self._reserved += free
        try:
            claim = await self.engine.claim_orphans(free)
        finally:
            self._reserved -= free
            self._wake.set()  # slots the orphans did not take go back to the claim loop
        for run in claim.claimed:
            self._spawn(self._recover(run), run)
        for run_id in claim.exhausted:
            self.counts["failed"] += 1
            log.warning(
                "recovery attempts exhausted",
                extra={"run_id": run_id, "action": "recover", "state": "failed"},
            )
        return len(claim.claimed)

    async def _slots_for_orphans(self) -> int:
        deadline = time.monotonic() + self.engine.settings.reaper_interval_s
        self._reaper_waiting = True
        try:
            while self._free() <= 0 and not self.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                self._freed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), timeout=left)
        finally:
            self._reaper_waiting = False
            self._wake.set()  # the claim loop may have held a slot back for us
        return 0 if self.stopping.is_set() else self._free()

    async def _notices(self) -> None:
        """Every ``reaper_interval_s``: re-send undelivered suspension notices. Its own
        task, so a webhook that never answers stalls nothing else."""
        while not self.stopping.is_set():
            reissued = await self.engine.reissue_notices()
            if reissued:
                log.info("notices reissued", extra={"action": "reissue", "runs": reissued})
            await self._pause(self.engine.settings.reaper_interval_s)

    async def _listener(self, dsn: str) -> None:
        """LISTEN on PostgreSQL in a thread of its own and wake the claim loop on each
        notice. A lost connection raises here, so the monitor logs it and reconnects."""
        loop = asyncio.get_running_loop()
        done = threading.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(self._wake.set)

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-listen")
        try:
            await loop.run_in_executor(pool, _listen, dsn, wake, done)
        finally:
            done.set()  # a cancelled wait leaves the thread running: tell it to return
            pool.shutdown(wait=False)


def _listen(dsn: str, wake: Callable[[], None], done: threading.Event) -> None:
    """Block on ``LISTEN tether_runs`` until ``done``; call ``wake`` on each notice (and
    once on connecting, for notices sent while no connection listened)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        try:
            wake()
            while not done.is_set():
                for _ in conn.notifies(timeout=1.0, stop_after=1):
                    wake()
        except RuntimeError:
            return  # the event loop closed under us
