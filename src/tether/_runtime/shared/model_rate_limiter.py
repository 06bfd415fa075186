"""The fleet's model rate in one process (reference §13): ``TETHER_MODEL_RPM`` and
``TETHER_MODEL_TPM``, one budget for every worker of the database.

One limiter per engine. A run about to call the model ``acquire``s a slot for its user:
from the slots this process leased for that user and has not handed out yet, else from a
new lease (``store.lease_capacity``). Runs wanting a slot at once are coalesced into one
lease (the first sends it for as many as want one then, by user; the others share it,
``single_flight``), so the database cost is at most one lease transaction per model call,
and less under load. A lease's slots are handed out for ``valid_s / 2`` after the
transaction began, so each request leaves within ``valid_s`` of the lease's ``at`` (the
margin the store counts); slots left at that deadline are given back.

The store shares what is free among the users waiting fleet-wide, in turn, the user who
used least of the window first (``store/model_rate.py``): a lease may get nothing for a user
because another limiter's user is owed it, and this limiter's users left short are
written down under its ``waiter`` id for the other limiters' leases to see.

When the fleet is full the store says when capacity is next due for this limiter (rows
aging out of the window, after what other users are owed): every waiting run of the
process sleeps until then (no busy-wait, no lease meanwhile; it wakes every ``NAP_S``
only to see whether its lease was lost or the worker is stopping), and the first to wake
leases for all of them.

Tokens (TPM) and given-back slots are sent with the next lease, or by a timer ``flush_s``
after they were noted when no lease comes sooner: a busy process pays nothing extra for
them, an idle one one transaction per ``flush_s`` at most, and the other workers learn of
a request's tokens within ``flush_s`` of its end. Recorded at the flush's time (not the
request's end), tokens stay in the window a little longer: the error is on the safe side.

No limit set: ``enabled`` is False and nothing here is called (no store call at all).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tether._runtime.hop import hop
from tether._runtime.single_flight import InFlight
from tether.config import Settings
from tether.store import Grant, Store
from tether.telemetry.content import db_error
from tether.telemetry.metrics import (
    RATE_LIMITED_RUNS,
    RATE_LIMITED_WAIT_SECONDS,
    RATE_LIMITED_WAITS,
)

log = logging.getLogger(__name__)

# How long a lease's slots are good for after its ``at`` (the store counts requests over
# the window plus this).
VALID_S = 1.0
# How long reported tokens and given-back slots wait for a lease to carry them.
FLUSH_S = 1.0
# A waiting run wakes at least this often to see whether it lost its lease or the worker
# is stopping (it never leases on such a wake).
NAP_S = 2.0
# How often a limiter asks its lease to delete old rows.
PURGE_EVERY_S = 60.0
# A wait is never shorter than this (the database's "next due" may already be past).
MIN_PAUSE_S = 0.01


@dataclass(kw_only=True)
class _Slots:
    """Slots of one lease row for one user: how many are left to hand out, until when
    (monotonic)."""

    user: str
    row: int
    left: int
    until: float


class RateLimiter:
    """The slots of the fleet's model capacity this process holds, and its waiting runs.
    Thread-safe and usable from several event loops (``SyncEngine``)."""

    def __init__(
        self,
        store: Store | None,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
        window_s: float = 60.0,
        valid_s: float = VALID_S,
        flush_s: float = FLUSH_S,
    ) -> None:
        self.store = store
        self.rpm = rpm
        self.tpm = tpm
        self.window_s = window_s
        self.valid_s = valid_s
        self.flush_s = flush_s
        self.enabled = store is not None and (rpm is not None or tpm is not None)
        self.waiter = uuid.uuid4().hex  # this limiter's name among the fleet's waiting
        self._leased = False  # whether a lease was asked for: its waits may be stored
        self._lock = threading.Lock()
        self._flight = InFlight()
        self._slots: list[_Slots] = []  # leased, not handed out yet
        self._wanting: Counter[str] = Counter()  # runs in ``acquire`` now, by user
        self._waiting = 0  # of them, those sleeping for capacity
        self._full_until = 0.0  # monotonic: no capacity expected before then
        self._limit = "rpm"
        self._tokens: Counter[str] = Counter()  # reported, not sent yet, by user
        self._returns: list[tuple[int, int]] = []  # unused slots to give back
        self._timer: threading.Timer | None = None
        self._purged = time.monotonic()
        self._closed = False
        self.leases = 0  # lease transactions sent (for observation)

    @classmethod
    def of(cls, store: Store, settings: Settings) -> RateLimiter:
        """The limiter ``settings`` ask for (``TETHER_MODEL_RPM`` / ``TETHER_MODEL_TPM``)."""
        return cls(
            store,
            rpm=settings.model_rpm,
            tpm=settings.model_tpm,
            window_s=settings.model_rate_window_s,
        )

    @classmethod
    def off(cls) -> RateLimiter:
        """A limiter that limits nothing."""
        return cls(None)

    @property
    def waiting(self) -> int:
        """How many runs of this process wait for capacity now."""
        return self._waiting

    async def acquire(
        self,
        user: str,
        *,
        on_wait: Callable[[str, float], Awaitable[None]],
        check: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> tuple[bool, float]:
        """Wait for one request start of ``user``'s run: whether it was granted (False:
        ``stopping()`` became true first) and the seconds spent here. ``on_wait(limit,
        seconds)`` is awaited once, when the run first has to sleep (the limit that holds
        it, the expected wait); ``check()`` is called at each wake and may raise (a lost
        lease)."""
        began = time.monotonic()
        slept = False
        with self._lock:
            self._wanting[user] += 1
            self._closed = False  # an engine used again after its close limits again
        try:
            while True:
                check()
                if stopping():
                    return False, time.monotonic() - began
                now = time.monotonic()
                with self._lock:
                    if self._take(user, now):
                        return True, time.monotonic() - began
                    pause, limit = self._full_until - now, self._limit
                if pause <= 0:
                    await self._flight.run("lease", self._lease)
                    continue
                if not slept:
                    slept = True
                    self._sleeping(+1)
                    RATE_LIMITED_WAITS.labels(limit=limit).inc()
                    await on_wait(limit, pause)
                await asyncio.sleep(min(max(pause, MIN_PAUSE_S), NAP_S))
        finally:
            with self._lock:
                self._wanting[user] -= 1
                if self._wanting[user] <= 0:
                    del self._wanting[user]
            if slept:
                self._sleeping(-1)
                RATE_LIMITED_WAIT_SECONDS.observe(time.monotonic() - began)

    def report(self, user: str, tokens: int) -> None:
        """Note the input and output tokens a request of ``user``'s run reported when it
        ended (TPM, and the user's share of the window); sent with the next lease or by the
        timer."""
        if not self.enabled or self.tpm is None or tokens <= 0:
            return
        with self._lock:
            self._tokens[user] += tokens
            self._arm(self.flush_s)

    def close(self) -> None:
        """Send what is noted and not sent yet, and stop the timer (the engine is closing).
        Best effort: tokens that cannot be sent now are lost (``docs/operations.md``)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._give_back_expired(float("inf"))
            self._closed = True  # no timer is armed from now on
            tokens, returns = self._pending()
        self._send(tokens, returns)
        if self.store is not None and self._leased:
            try:
                self.store.forget_waits(self.waiter)
            except Exception as exc:  # they lapse by themselves (``store/model_rate.py``)
                log.warning("waiting users not struck", extra={"error": db_error(exc)})

    # -- inside ----------------------------------------------------------------------------

    def _take(self, user: str, now: float) -> bool:
        """Under the lock: hand ``user``'s run one slot if one of the user's is left and
        still good."""
        if self._give_back_expired(now):
            self._arm(self.flush_s)
        for slots in self._slots:
            if slots.user == user and slots.left > 0:
                slots.left -= 1
                return True
        return False

    def _give_back_expired(self, now: float) -> bool:
        """Under the lock: slots no longer to be handed out are noted to go back to the
        store; whether there were any."""
        kept: list[_Slots] = []
        returns: list[tuple[int, int]] = []
        for slots in self._slots:
            if now < slots.until and slots.left:
                kept.append(slots)
            elif slots.left:
                returns.append((slots.row, slots.left))
        self._slots = kept
        self._returns.extend(returns)
        return bool(returns)

    def _wants(self, now: float) -> dict[str, int]:
        """Under the lock: how many more slots each user's runs want than are left."""
        left: Counter[str] = Counter()
        for slots in self._slots:
            if now < slots.until:
                left[slots.user] += slots.left
        return {user: n - left[user] for user, n in self._wanting.items() if n > left[user]}

    def _sleeping(self, delta: int) -> None:
        with self._lock:
            self._waiting += delta
        RATE_LIMITED_RUNS.inc(delta)

    async def _lease(self) -> None:
        """One lease for every run wanting a slot now, carrying what waits to be sent."""
        with self._lock:
            now = time.monotonic()
            wants = self._wants(now)
            if not wants:
                return  # a lease that ended meanwhile left slots: take those first
            tokens, returns = self._pending()
            purge = now - self._purged >= PURGE_EVERY_S
            if purge:
                self._purged = now
        assert self.store is not None
        self._leased = True
        try:
            grant = await hop(
                self.store.lease_capacity,
                wants=wants,
                rpm=self.rpm,
                tpm=self.tpm,
                window_s=self.window_s,
                valid_s=self.valid_s,
                waiter=self.waiter,
                tokens=tokens,
                give_back=returns,
                purge=purge,
            )
        except BaseException:
            with self._lock:
                self._tokens.update(tokens)
                self._returns.extend(returns)
            raise
        self._granted(grant, now)

    def _granted(self, grant: Grant, began: float) -> None:
        """Put a lease's slots in the pool, by user, and when this limiter is left short,
        note until when."""
        after = time.monotonic()
        with self._lock:
            self.leases += 1
            until = began + self.valid_s / 2
            for user, count in grant.granted.items():
                if count:
                    slots = _Slots(user=user, row=grant.rows[user], left=count, until=until)
                    self._slots.append(slots)
            if grant.total:
                self._arm(max(0.0, until - after) + 0.01)  # unused ones go back then
            if grant.next_at is not None:
                self._full_until = after + max(grant.next_at - grant.at, MIN_PAUSE_S)
                self._limit = grant.limit or "rpm"

    def _pending(self) -> tuple[dict[str, int], list[tuple[int, int]]]:
        """Under the lock: the tokens (by user) and give-backs to send, taken."""
        tokens, returns = dict(self._tokens), self._returns
        self._tokens, self._returns = Counter(), []
        return tokens, returns

    def _arm(self, delay: float) -> None:
        """Under the lock: make sure a flush runs within ``delay`` seconds."""
        if self._timer is not None or self._closed:
            return
        self._timer = threading.Timer(delay, self._on_timer)
        self._timer.daemon = True
        self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            self._give_back_expired(time.monotonic())
        self._flush()

    def _flush(self) -> None:
        """Send the noted tokens and give-backs (in the timer's thread); kept for the next
        lease or timer when the database cannot take them now."""
        with self._lock:
            if self._closed:
                return
            tokens, returns = self._pending()
        if not self._send(tokens, returns):
            with self._lock:
                self._tokens.update(tokens)
                self._returns.extend(returns)
                self._arm(self.flush_s)

    def _send(self, tokens: dict[str, int], returns: list[tuple[int, int]]) -> bool:
        """One lease of no request carrying ``tokens`` and ``returns``; whether it went."""
        if self.store is None or not (tokens or returns):
            return True
        try:
            self.store.lease_capacity(
                wants={},
                rpm=self.rpm,
                tpm=self.tpm,
                window_s=self.window_s,
                valid_s=self.valid_s,
                tokens=tokens,
                give_back=returns,
            )
        except Exception as exc:
            told = {"action": "rate_flush", "error": db_error(exc)}
            log.warning("model usage not recorded", extra=told)
            return False
        return True
