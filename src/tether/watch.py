"""Live events of a run (SPEC §11): its stored events, in order, as they are written.

A watcher reads the run's events from the store, never from memory, so a watcher that
reconnects with the last SEQ it saw misses nothing and sees nothing twice. SEQ is an
event's ordinal in its run, from 1: events of a run are written only under the run's row
lock, so they commit in id order and an event's SEQ never changes once it is visible.

Between reads a watcher waits to be woken. On PostgreSQL the store announces, once a
transaction that gave a run events has ended, ``NOTIFY tether_events`` with the run's id
(``tether.store.announce``: batched, sent off the writers' commits); one ``LISTEN``
connection per engine (opened while anyone watches) wakes that run's watchers, and a
re-read every ``FALLBACK_S`` (or the poll interval, if longer) covers a notice that was
lost. On SQLite a watcher polls every ``POLL_S``. A watch ends after the events of a run in
a terminal state (answered, failed, cancelled), or when the run is gone (purged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from tether.errors import InvalidInput
from tether.listen import CONNECTED, listen
from tether.runs import iso
from tether.services import hop
from tether.store import Event, Store
from tether.store.announce import CHANNEL as EVENTS_CHANNEL

log = logging.getLogger(__name__)

POLL_S = 0.5  # SQLite, or PostgreSQL while the listener is not connected
FALLBACK_S = 15.0  # PostgreSQL with a listener: a re-read now and then, notice or not
RELISTEN_S = 1.0  # after a lost listener connection
BATCH = 500  # events per read
# A watcher reads at most this often: the steps of a busy run share a read (and its
# thread hop and query) instead of costing one each; an idle run's first event is read
# at once.
MIN_READ_INTERVAL_S = 0.05


@dataclass(frozen=True, kw_only=True)
class LiveEvent:
    """One stored event of a run, with its SEQ (its ordinal in the run, from 1)."""

    seq: int
    run_id: str
    at: float
    kind: str
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": iso(self.at), "kind": self.kind, "data": self.data}


def after_seq(value: Any) -> int:
    """A SEQ to start after: an integer ≥ 0 (or its decimal string, as HTTP sends it);
    anything else is ``invalid_input``."""
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 18:
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidInput(f"after must be a non-negative integer (an event's SEQ), got {value!r:.40}")


class Wakeups:
    """Wakes the watchers of a run when it is given events: one per engine. The listener
    runs only while someone watches, on the event loop of the watchers."""

    def __init__(self, store: Store, *, poll_s: float = POLL_S) -> None:
        self._dsn = store.listen_dsn()
        self._poll_s = poll_s
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._listening = False

    @property
    def timeout_s(self) -> float:
        """How long a watcher waits for a notice before it reads again anyway."""
        return max(FALLBACK_S, self._poll_s) if self._listening else self._poll_s

    @contextlib.contextmanager
    def waiter(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever ``run_id`` may have been given events, while in use."""
        woken = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(woken)
        if self._dsn is not None and (self._listener is None or self._listener.done()):
            self._listener = asyncio.get_running_loop().create_task(self._listen(self._dsn))
        try:
            yield woken
        finally:
            waiters = self._waiters.get(run_id, set())
            waiters.discard(woken)
            if not waiters:
                self._waiters.pop(run_id, None)
            if not self._waiters:
                self.stop()

    def stop(self) -> None:
        """Stop listening (the next watcher listens again)."""
        if self._listener is not None:
            self._listener.cancel()
            self._listener = None
        self._listening = False

    async def _listen(self, dsn: str) -> None:
        while True:
            try:
                await listen(dsn, self._noticed, EVENTS_CHANNEL)
            except Exception as exc:  # watchers poll meanwhile; listen again shortly
                log.warning("event listener lost: %s", exc, extra={"action": "listen_lost"})
            self._listening = False
            await asyncio.sleep(RELISTEN_S)

    def _noticed(self, payload: str) -> None:
        if payload == CONNECTED:  # anything may have happened while none listened
            self._listening = True
            woken = [w for ws in self._waiters.values() for w in ws]
        else:
            woken = list(self._waiters.get(payload, ()))
        for waiter in woken:
            waiter.set()


async def watch(
    store: Store, wakeups: Wakeups, run_id: str, after: int
) -> AsyncIterator[LiveEvent]:
    """The run's events after SEQ ``after``, as they are stored, until the run is in a
    terminal state (or gone). The caller has checked the run and ``after``."""
    seq, last_id, skip = after, 0, after
    loop = asyncio.get_running_loop()
    read_at = -MIN_READ_INTERVAL_S
    with wakeups.waiter(run_id) as woken:
        while True:
            pause = read_at + MIN_READ_INTERVAL_S - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)  # notices meanwhile are covered by this read
            woken.clear()  # a notice from here on makes the wait below return at once
            read_at = loop.time()
            state, batch = await hop(
                store.events_after, run_id, last_id=last_id, skip=skip, limit=BATCH
            )
            if state is None:
                return
            for event in batch:
                seq += 1
                yield _live(seq, event)
            if batch:
                last_id, skip = batch[-1].id, 0
            if len(batch) == BATCH:
                continue
            if state.terminal:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wakeups.timeout_s)


def _live(seq: int, event: Event) -> LiveEvent:
    return LiveEvent(seq=seq, run_id=event.run_id, at=event.at, kind=event.kind, data=event.data)
