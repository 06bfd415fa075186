"""Live events of a run (reference §11): its stored events, in order, as they are written.

A watcher is fed from the store, never from memory, so a watcher that reconnects with the
last SEQ it saw misses nothing and sees nothing twice. SEQ is an event's ordinal in its
run, from 1: events of a run are written only under the run's row lock, so they commit in
id order and an event's SEQ never changes once it is visible.

One ``Feed`` per engine reads for all its watchers: each round is one read of the states
and new events of every run due (a watcher's first read of a run, when it starts after a
SEQ, is a read of its own), at most one round per ``MIN_ROUND_S``. So 100 watchers of busy
runs cost the database a few reads a second, not one per event per watcher. A run is due
when a notice says it was given events, and every run is due after ``FALLBACK_S`` without
one (or the poll interval, if longer). On PostgreSQL the store announces runs given events
(``NOTIFY tether_events`` with the run's id, ``tether.store.backend.announce``) and, while
anyone watches, the process's one ``LISTEN`` connection (shared with the claim loop and the
deltas, ``tether.store.backend.listening``) marks them due; on SQLite every run is due
every ``POLL_S``. A watch ends after the events of a run in a terminal state
(answered, failed, cancelled), or when the run is gone (purged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tether._runtime.hop import hop
from tether._runtime.live.deltas import DeltaHub
from tether.results import Delta, LiveEvent
from tether.runs import RunState
from tether.store import Event, Store
from tether.store.backend.listen import CONNECTED, EVENTS_CHANNEL, listen
from tether.telemetry.content import db_error

log = logging.getLogger(__name__)

POLL_S = 0.5  # SQLite, or PostgreSQL while the listener is not connected
FALLBACK_S = 15.0  # PostgreSQL with a listener: every run is read now and then anyway
RELISTEN_S = 1.0  # after a lost listener connection
MIN_ROUND_S = 0.05  # the steps of a busy run share a round; an idle run's event is read at once
BATCH = 2000  # events per round


@dataclass(eq=False, kw_only=True)
class _Watcher:
    """One watch of a run: where it is, and what the feed has read for it."""

    run_id: str
    seq: int  # the SEQ of the last event read for it
    skip: int  # events of the run to skip before the first read (its start after a SEQ)
    last_id: int = 0  # the id of the last event read for it
    due: bool = True
    ended: bool = False
    failed: BaseException | None = None
    read: list[LiveEvent] = field(default_factory=list)
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self, events: list[Event], state: RunState | None, complete: bool) -> None:
        """Hand it its run's events of a round (those past where it is) and the state."""
        for event in events:
            if event.id > self.last_id:
                self.seq += 1
                self.last_id = event.id
                self.read.append(LiveEvent.of(event, self.seq))
        self.ended = state is None or (state.terminal and complete)
        self.due = self.due or not complete
        self.woken.set()


def _waker(woken: asyncio.Event) -> Callable[[], None]:
    """A wake-up for ``woken`` that any thread may call (deltas come from other threads)."""
    loop = asyncio.get_running_loop()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the watcher's loop has closed
            loop.call_soon_threadsafe(woken.set)

    return wake


def _turn(event: LiveEvent) -> tuple[int, str]:
    """A ``model_turn`` event's step and text."""
    return int(event.data.get("step") or 0), str(event.data.get("text") or "")


class Feed:
    """Reads the events of every run watched through one engine, in rounds; the reader and
    the listener run only while someone watches, on the watchers' event loop."""

    def __init__(self, store: Store, *, poll_s: float = POLL_S) -> None:
        self._store = store
        self._dsn = store.listen_dsn()
        self._poll_s = poll_s
        self._watchers: set[_Watcher] = set()
        self._of_run: dict[str, set[_Watcher]] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = False

    @property
    def timeout_s(self) -> float:
        """How long the feed waits for a notice before it reads every run anyway."""
        return max(FALLBACK_S, self._poll_s) if self._listening else self._poll_s

    async def watch(
        self, run_id: str, after: int, deltas: DeltaHub | None = None
    ) -> AsyncIterator[LiveEvent | Delta]:
        """The run's events after SEQ ``after``, as they are stored, until the run is in a
        terminal state (or gone). The caller has checked the run and ``after``. With a hub
        of ``deltas``, the text of the step being generated too (reference §16): before a
        ``model_turn``, every delta of its step written before it (``caught_up``: from
        another process too), so a delta of a step whose ``model_turn`` it has yielded is
        left out (none is missing: that event holds it all)."""
        watcher = _Watcher(run_id=run_id, seq=after, skip=after)
        self._watchers.add(watcher)
        self._of_run.setdefault(run_id, set()).add(watcher)
        self._start()
        sub = None if deltas is None else deltas.subscribe(run_id, _waker(watcher.woken))
        stored = 0  # the last step whose model_turn was yielded
        try:
            while True:
                await watcher.woken.wait()
                watcher.woken.clear()
                if watcher.failed is not None:
                    raise watcher.failed
                # What was read and whether that was the end, together: a round may read
                # more (the end too) while this yields; the next turn of the loop gets it.
                read, watcher.read, ended = watcher.read, [], watcher.ended
                held: list[Delta] = []
                if sub is not None:
                    turns = [_turn(e) for e in read if e.kind == "model_turn"]
                    if turns:  # every delta of their steps first, to the end of its text
                        await sub.caught_up(turns)
                    held = sub.take()
                for event in read:
                    if event.kind == "model_turn":
                        step = _turn(event)[0]
                        for delta in (d for d in held if stored < d.step <= step):
                            yield delta
                        held = [d for d in held if d.step > step]
                        stored = max(stored, step)
                    yield event
                for delta in held:  # the step being generated
                    if delta.step > stored:
                        yield delta
                if ended:
                    return
        finally:
            if sub is not None:
                sub.close()
            self._watchers.discard(watcher)
            same_run = self._of_run.get(run_id, set())
            same_run.discard(watcher)
            if not same_run:
                self._of_run.pop(run_id, None)
            if not self._watchers:
                self.stop()

    def stop(self) -> None:
        """Stop reading and listening (the next watcher starts them again)."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self._listening = False

    def _start(self) -> None:
        if self._tasks and not all(task.done() for task in self._tasks):
            self._wake.set()
            return
        self._wake = asyncio.Event()  # of this event loop
        self._wake.set()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._rounds())]
        if self._dsn is not None:
            self._tasks.append(loop.create_task(self._listen(self._dsn)))

    async def _rounds(self) -> None:
        loop = asyncio.get_running_loop()
        last = -math.inf
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.timeout_s)
            if not self._wake.is_set():  # no notice for a while: read every run
                for watcher in self._watchers:
                    watcher.due = True
            pause = last + MIN_ROUND_S - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)  # notices meanwhile join this round
            self._wake.clear()
            last = loop.time()
            due = [w for w in self._watchers if w.due]
            for watcher in due:
                watcher.due = False
            try:
                await self._round(due)
            except Exception as exc:  # the store gave up (hop retried): the watches fail
                for watcher in due:
                    watcher.failed = exc
                    watcher.woken.set()
            if any(w.due for w in self._watchers):
                self._wake.set()

    async def _round(self, due: list[_Watcher]) -> None:
        """One read for the runs of ``due`` (and one of its own for each watcher that
        starts after a SEQ and has not reached it yet: it skips that many events)."""
        cursors: dict[str, int] = {}
        shared: list[_Watcher] = []
        for watcher in due:
            if watcher.skip:
                state, events = await hop(
                    self._store.events_after,
                    watcher.run_id,
                    last_id=0,
                    skip=watcher.skip,
                    limit=BATCH,
                )
                if events:  # past its SEQ: from here on it reads from its last id
                    watcher.skip = 0
                watcher.take(events, state, complete=len(events) < BATCH)
            else:
                known = cursors.get(watcher.run_id, watcher.last_id)
                cursors[watcher.run_id] = min(known, watcher.last_id)
                shared.append(watcher)
        if not cursors:
            return
        states, events = await hop(self._store.events_of_runs, cursors, limit=BATCH)
        complete = len(events) < BATCH
        of_run: dict[str, list[Event]] = {}
        for event in events:
            of_run.setdefault(event.run_id, []).append(event)
        for watcher in shared:
            run_id = watcher.run_id
            watcher.take(of_run.get(run_id, []), states.get(run_id), complete)

    async def _listen(self, dsn: str) -> None:
        while True:
            try:
                await listen(dsn, self._noticed, EVENTS_CHANNEL)
            except Exception as exc:  # the feed polls meanwhile; listen again shortly
                told = {"action": "listen_lost", "error": db_error(exc)}
                log.warning("event listener lost", extra=told)
            self._listening = False
            await asyncio.sleep(RELISTEN_S)

    def _noticed(self, payload: str) -> None:
        if payload == CONNECTED:  # anything may have happened while none listened
            self._listening = True
            woken: set[_Watcher] = self._watchers
        else:
            woken = self._of_run.get(payload, set())
        for watcher in woken:
            watcher.due = True
        if woken:
            self._wake.set()
