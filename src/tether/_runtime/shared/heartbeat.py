"""The heartbeat: one task per engine keeps the lease of every run the process holds.

A run is held by a worker carrying it, by the reaper recovering it, and by the request
that executes an approval. Each of them registers its lease while it holds the run, and
one task refreshes all of them every third of the heartbeat timeout, in one transaction,
whatever the runs are doing: a long model call, a slow tool (plain functions run in a
thread, so they never stop the beat), a re-check. A lease the store no longer honours
was taken over (the process was taken for dead): it is marked lost, and its owner starts
no further tool or model call (its writes were already fenced, invariant 8).

The beat runs on the event loop, not in a thread of its own: an event loop that cannot
run for a whole heartbeat timeout carries no run either, and its runs should be taken.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from tether._runtime.hop import hop
from tether.errors import LeaseLost
from tether.runs import Lease
from tether.store import Store
from tether.telemetry.content import db_error

log = logging.getLogger(__name__)


@dataclass(eq=False, kw_only=True)
class Held:
    """A lease this process holds; ``lost`` once the store stopped honouring it."""

    lease: Lease
    lost: bool = False

    def check(self) -> None:
        """Raise ``LeaseLost`` if another owner took the run."""
        if self.lost:
            raise LeaseLost("this worker no longer owns the run", run_id=self.lease.run_id)


class Heartbeat:
    """Refreshes every held lease each ``interval_s``; started on the first ``hold`` in
    an event loop and ended when nothing is held."""

    def __init__(self, store: Store, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._held: set[Held] = set()
        self._task: asyncio.Task[None] | None = None
        # A beat runs in a thread; ``stop`` waits for one in flight, so no beat opens a
        # connection after the engine closed its store.
        self._lock = threading.Lock()
        self._stopped = False

    def hold(self, lease: Lease) -> Held:
        """Keep ``lease`` alive until ``drop``."""
        held = Held(lease=lease)
        self._held.add(held)
        self._stopped = False  # an engine used again after close beats again
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._beat(), name="tether-heartbeat")
        return held

    def drop(self, held: Held) -> None:
        """Stop refreshing ``held`` (its owner let go of the run)."""
        self._held.discard(held)

    def stop(self) -> None:
        """Stop beating (the engine is closing): nothing is held any more. Blocks until a
        beat in flight has finished."""
        self._held.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        with self._lock:
            self._stopped = True

    def _refresh(self, leases: list[Lease]) -> list[bool]:
        """One beat, in a thread: refresh ``leases``; for each, whether it is still held."""
        with self._lock:
            if self._stopped:
                return [False] * len(leases)
            return self.store.heartbeat_many(leases)

    @property
    def holding(self) -> int:
        return len(self._held)

    async def _beat(self) -> None:
        while self._held:
            await asyncio.sleep(self.interval_s)
            beating = list(self._held)
            if not beating:
                return
            try:
                alive = await hop(self._refresh, [h.lease for h in beating])
            except Exception as exc:
                # The database is away: nothing to do but try again next time. Runs whose
                # heartbeat goes stale meanwhile are recovered by a reaper.
                log.warning("heartbeat failed", extra={"action": "beat", "error": db_error(exc)})
                continue
            for held, ok in zip(beating, alive, strict=True):
                if not ok and held in self._held:
                    # Taken over, or its holder's last write (or a cancel) landed just
                    # before this beat: either way its owner starts nothing more. Only a
                    # holder that then tries to go on was taken over, and it says so
                    # ("lease lost", from ``LeaseLost``); a finished one says nothing.
                    held.lost = True
                    self._held.discard(held)
                    log.info(
                        "lease not honoured",
                        extra={"run_id": held.lease.run_id, "action": "beat"},
                    )
