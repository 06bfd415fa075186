"""The worker: claims runs that wait for a worker and carries many of them at once, and
runs the reaper (orphans, expiry, retention) on its interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from tether.engine import Engine
from tether.loop import Outcome
from tether.resume import start_driver
from tether.runs import Run

log = logging.getLogger(__name__)


class Worker:
    """Carries up to ``concurrency`` runs at once on one engine."""

    def __init__(self, engine: Engine, *, concurrency: int = 8, poll_s: float = 0.5) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.engine = engine
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.stopping = asyncio.Event()
        self.finished: list[Outcome] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Stop claiming new runs; runs in hand are carried to their next stop."""
        self.stopping.set()

    async def run(self, *, exit_when_idle: bool = False, reap: bool = True) -> None:
        """Claim and carry runs until stopped (or, with ``exit_when_idle``, until no run
        waits and none is in hand)."""
        next_reap = time.monotonic()
        while not self.stopping.is_set():
            if reap and time.monotonic() >= next_reap:
                await self._reap()
                next_reap = time.monotonic() + self.engine.settings.reaper_interval_s
            claimed = await self._fill()
            if not claimed and not self._tasks and exit_when_idle:
                break
            if not claimed:
                await self._idle()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _fill(self) -> bool:
        claimed = False
        while len(self._tasks) < self.concurrency and not self.stopping.is_set():
            run = await asyncio.to_thread(self.engine.store.claim_ready, self.engine.worker_id)
            if run is None:
                break
            claimed = True
            task = asyncio.create_task(self._carry(run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return claimed

    async def _carry(self, run: Run) -> None:
        run_id = run.id
        try:
            driver = await start_driver(self.engine.services, run)
            outcome = await driver.drive()
            self.finished.append(outcome)
            log.info("run stopped", extra={"run_id": run_id, "action": outcome.kind.value})
        except Exception:
            log.exception("worker task failed", extra={"run_id": run_id, "action": "carry"})

    async def _idle(self) -> None:
        stop = asyncio.create_task(self.stopping.wait())
        waits: set[asyncio.Task[Any]] = {stop, *self._tasks}
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait(waits, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()

    async def _reap(self) -> None:
        try:
            summary = await self.engine.reap()
            if summary["recovered"] or summary["expired"] or summary["purged"]:
                log.info("reaped", extra={"action": "reap", **summary})
        except Exception:
            log.exception("reaper pass failed", extra={"action": "reap"})
