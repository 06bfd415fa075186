"""The worker: claims runs that wait for a worker and carries many of them at once, and
runs the reaper (orphans, expiry, notices, retention) on its interval.

On PostgreSQL it sleeps on ``LISTEN tether_runs`` (the store notifies in the transaction
that makes a run ready) instead of waiting for the next poll. On ``stop()`` (SIGTERM) it
stops claiming, and each run in hand is handed back at its next step boundary, releasing
the lease so another worker takes it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import psycopg

from tether.engine import Engine
from tether.loop import Outcome
from tether.resume import start_driver
from tether.runs import Run

log = logging.getLogger(__name__)

CHANNEL = "tether_runs"


class Worker:
    """Carries up to ``concurrency`` runs at once on one engine."""

    def __init__(
        self, engine: Engine, *, concurrency: int = 8, poll_s: float | None = None
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.engine = engine
        self.concurrency = concurrency
        # With LISTEN/NOTIFY the poll is only a fallback.
        self.poll_s = poll_s if poll_s is not None else (0.25 if engine.store.sqlite else 5.0)
        self.stopping = asyncio.Event()
        self.finished: list[Outcome] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()

    def stop(self) -> None:
        """Stop claiming; runs in hand are handed back at their next step boundary."""
        self.stopping.set()
        self._wake.set()

    async def run(self, *, exit_when_idle: bool = False, reap: bool = True) -> None:
        """Claim and carry runs until stopped (or, with ``exit_when_idle``, until no run
        waits and none is in hand)."""
        listener = self._listen() if not self.engine.store.sqlite else None
        next_reap = time.monotonic()
        try:
            while not self.stopping.is_set():
                if reap and time.monotonic() >= next_reap:
                    await self._reap()
                    next_reap = time.monotonic() + self.engine.settings.reaper_interval_s
                self._wake.clear()
                claimed = await self._fill()
                if not claimed and not self._tasks and exit_when_idle:
                    break
                if not claimed:
                    await self._idle()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if listener is not None:
                listener.set()

    async def _fill(self) -> bool:
        claimed = False
        while len(self._tasks) < self.concurrency and not self.stopping.is_set():
            run = await asyncio.to_thread(self.engine.store.claim_ready, self.engine.worker_id)
            if run is None:
                break
            claimed = True
            task = asyncio.create_task(self._carry(run))
            self._tasks.add(task)
            task.add_done_callback(self._done)
        return claimed

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()  # a slot is free

    async def _carry(self, run: Run) -> None:
        try:
            driver = await start_driver(self.engine.services, run, stopping=self.stopping)
            outcome = await driver.drive()
            self.finished.append(outcome)
            log.info(
                "run stopped",
                extra={"run_id": run.id, "action": outcome.kind.value, "state": outcome.reason},
            )
        except Exception:
            log.exception("worker task failed", extra={"run_id": run.id, "action": "carry"})

    async def _idle(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)

    async def _reap(self) -> None:
        try:
            summary = await self.engine.reap()
            if any(summary.values()):
                log.info("reaped", extra={"action": "reap", "summary": summary})
        except Exception:
            log.exception("reaper pass failed", extra={"action": "reap"})

    def _listen(self) -> threading.Event:
        """Start a thread that LISTENs on PostgreSQL and wakes the loop on each notice.
        Returns the event that stops it."""
        done = threading.Event()
        loop = asyncio.get_running_loop()
        url = self.engine.store.engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        threading.Thread(
            target=_listen_thread, args=(url, loop, self._wake, done), daemon=True
        ).start()
        return done


def _listen_thread(
    url: str, loop: asyncio.AbstractEventLoop, wake: asyncio.Event, done: threading.Event
) -> None:
    while not done.is_set():
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                while not done.is_set():
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        loop.call_soon_threadsafe(wake.set)
        except psycopg.Error:
            log.warning("LISTEN connection lost; retrying", extra={"action": "listen"})
            done.wait(1.0)
        except RuntimeError:
            return  # the event loop closed
    return
