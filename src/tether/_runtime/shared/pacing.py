"""Pacing: a process whose runs want more CPU than it has keeps its event loop responsive.

One process carries its runs on one core (the interpreter's lock). While each run's next
model request waits a second on the model, a thousand runs in hand are a thousand steps
a second to store, more than one core does; without pacing every answer that arrives
queues behind the others on the event loop, which then lags by hundreds of
milliseconds: the heartbeat, the claims, an API request of ``serve`` and every step wait
that long (``benchmarks/capacity.py``). The steps per second are the process's all the
same.

So the model requests in flight are bounded by a limit that follows the event loop's lag
(additive increase, multiplicative decrease, as TCP does with a network's): a watch task
asks to wake every ``SAMPLE_S``; when it wakes more than ``TARGET_S`` late the limit
falls by a tenth, and when it wakes well on time while runs wait for a request, it rises
by a twentieth. The limit never falls below ``FLOOR`` (a process carrying a few runs is never
paced) and starts at no limit. A run that waits keeps its lease (the heartbeat beats for
it) and its wait is not active time (``elapsed_ms``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator

log = logging.getLogger(__name__)

# The event loop's lag the limit aims under, how often it is sampled, and the fewest model
# requests a process is ever held to. The target trades steps per second for lag: a lower
# one keeps the lag lower and stores fewer steps a second (benchmarks/README.md, capacity,
# has the figures of each target).
TARGET_S = 0.05
SAMPLE_S = 0.05
FLOOR = 16
# The watch ends after this many samples without runs in flight, and starts again with them.
IDLE_SAMPLES = 20


class Pacer:
    """Bounds the model requests in flight in this process by the event loop's lag."""

    def __init__(self, *, watch: bool = True) -> None:
        # Whether a task samples the loop's lag (a test feeds ``adjust`` itself).
        self._watches = watch
        self.limit: float = float("inf")  # no limit until the loop lags
        self.in_flight = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._watch: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[float]:
        """Hold a place for one model request; yields the seconds waited for it."""
        waited = await self._enter()
        try:
            yield waited
        finally:
            self._leave()

    async def _enter(self) -> float:
        self._ensure_watch()
        if self.in_flight < self.limit and not self._waiting:
            self.in_flight += 1
            return 0.0
        loop = asyncio.get_running_loop()
        began = loop.time()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._leave()  # given a place just as it was cancelled: give it back
            else:
                self._waiting.remove(turn)
            raise
        return loop.time() - began

    def _leave(self) -> None:
        self.in_flight -= 1
        self._admit()

    def _admit(self) -> None:
        """Let waiting runs in, oldest first, while the limit allows."""
        while self._waiting and self.in_flight < self.limit:
            turn = self._waiting.popleft()
            if not turn.done():
                self.in_flight += 1
                turn.set_result(None)

    def adjust(self, lag_s: float) -> None:
        """One sample of the event loop's lag: the limit falls when it is over the target,
        and rises while runs wait and it is well under."""
        if lag_s > TARGET_S:
            base = self.in_flight if self.limit == float("inf") else self.limit
            lowered = max(float(FLOOR), base * 0.9)
            if lowered < self.limit:
                self.limit = lowered
                log.debug("paced", extra={"action": "pace", "limit": int(lowered)})
        elif lag_s < TARGET_S / 2 and self._waiting:
            self.limit += max(1.0, self.limit / 20)
            self._admit()

    def _ensure_watch(self) -> None:
        if not self._watches:
            return
        loop = asyncio.get_running_loop()
        if self._watch is None or self._watch.done() or self._watch.get_loop() is not loop:
            self._watch = loop.create_task(self._sample(), name="tether-pacer")

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        idle = 0
        while idle < IDLE_SAMPLES:
            due = loop.time() + SAMPLE_S
            await asyncio.sleep(SAMPLE_S)
            self.adjust(loop.time() - due)
            idle = 0 if self.in_flight or self._waiting else idle + 1
        self.limit = float("inf")  # nothing in flight for a while: start afresh
