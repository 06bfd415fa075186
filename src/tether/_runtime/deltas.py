"""The model's text as it is written, to the watchers of its run (reference §16).

One ``DeltaHub`` per database in a process (``hub_for``), shared by its engines. The
process that carries a step hands the model's text to it piece by piece (``stream``); it
keeps the step's text so far, so a watcher that arrives mid-step first gets it as one
delta at offset 0. Each model call is a new *generation*: a repeated call (after a crash
or a retry) starts again at 0, and a watcher replaces that step's text. Nothing here is
durable: the stored ``model_turn`` event carries the whole text.

Watchers in this process subscribe (``subscribe``); each has a bounded queue, and one that
falls behind is dropped to a catch-up (the text so far at offset 0 once it reads again), so
a stalled watcher never makes the carrying process buffer without limit.

On PostgreSQL, watchers in other processes are reached through notices, off every
writer's transaction, on connections of their own:
- a watching process asks for a run on ``WATCH_CHANNEL`` (on subscribing, when its
  listener (re)connects, every ``INTEREST_S`` while it watches, and at once when a process
  that carries steps begins to listen: its roll call on ``DELTAS_CHANNEL``);
- a process carrying a step of a run asked for within ``INTEREST_TTL_S`` sends its text on
  ``DELTAS_CHANNEL`` (batched by the announcer's thread; a new ask makes it send the text
  so far again from 0), and an end marker when the model call returns;
- a run nobody asked for sends nothing, so a run with no watchers costs its worker one
  append per piece.
A receiving process forwards to its watchers only text that follows what they hold (a
repeat is trimmed, a gap asks again), so its watchers see the step's text without gap or
overlap. On SQLite only watchers in the carrying process get deltas.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tether.results import Delta
from tether.store import Store
from tether.store.announce import Announcer
from tether.store.listen import DELTAS_CHANNEL, WATCH_CHANNEL, Subscriber

INTEREST_S = 2.0  # a watching process asks again for its runs this often
INTEREST_TTL_S = 3 * INTEREST_S + 1.0  # a carrying process sends a run's text this long after
LINGER_S = 10.0  # a process listens to asks this long after its last model call
MAX_QUEUED_CHARS = 65_536  # a watcher further behind than this is dropped to a catch-up
MAX_QUEUED = 1024  # or this many deltas behind
_ROLL_CALL = '{"roll":1}'
PAYLOAD_BYTES = 7900  # a notice's payload must stay under PostgreSQL's 8000 bytes


@dataclass(eq=False)
class _Text:
    """The text of one model call of a step, as far as this process knows it."""

    step: int
    gen: str
    parts: list[str] = field(default_factory=list)
    length: int = 0  # code points
    ended: bool = False

    def whole(self) -> str:
        return "".join(self.parts)


@dataclass(eq=False)
class _Local:
    """A step this process carries: what of its text went to other processes."""

    text: _Text
    sent_parts: int = 0
    sent_length: int = 0
    resend: bool = False  # asked again: send it all from 0
    end_sent: bool = False


class DeltaSubscription:
    """One watcher's queue of deltas. ``wake`` is called (from any thread) when it was
    empty and is no longer; ``take`` empties it."""

    def __init__(self, hub: DeltaHub, run_id: str, wake: Callable[[], None]) -> None:
        self._hub = hub
        self.run_id = run_id
        self._wake = wake
        self._queue: deque[Delta] = deque()
        self._chars = 0
        self._signalled = False
        self.behind = False  # dropped: its next take starts with a catch-up

    def offer(self, delta: Delta) -> None:
        """Queue ``delta`` (under the hub's lock)."""
        if self.behind:
            return  # the catch-up will hold it
        if self._chars + len(delta.text) > MAX_QUEUED_CHARS or len(self._queue) >= MAX_QUEUED:
            self._queue.clear()
            self._chars = 0
            self.behind = True
        else:
            self._queue.append(delta)
            self._chars += len(delta.text)
        if not self._signalled:
            self._signalled = True
            self._wake()

    def take(self) -> list[Delta]:
        """The deltas queued since the last take (a catch-up first if it fell behind)."""
        return self._hub.drain(self)

    def drained(self) -> list[Delta]:
        """Empty the queue (under the hub's lock)."""
        taken = list(self._queue)
        self._queue.clear()
        self._chars = 0
        self._signalled = False
        return taken

    def close(self) -> None:
        self._hub.unsubscribe(self)


@dataclass(eq=False)
class _Run:
    run_id: str
    text: _Text | None = None
    local: _Local | None = None
    watchers: set[DeltaSubscription] = field(default_factory=set)


class DeltaHub:
    """The deltas of every run of one database in this process (see the module)."""

    def __init__(self, dsn: str | None) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._wanted: dict[str, float] = {}  # run id → until when other processes watch it
        self._dirty: set[str] = set()  # local steps with text (or an end) to send
        self._asks: set[str] = set()  # runs to ask for
        self._asked_at = 0.0
        self._streaming = 0  # model calls of this process in flight
        self._streamed_at = -LINGER_S  # when the last one ended
        self.holders = 0  # engines of this process using it (``hub_for``)
        self._roll_call = False  # ask watching processes to ask again (we listen now)
        self._announcer = Announcer(dsn)
        self._announcer.add_source(self._notices)
        self._subscriber = (
            None
            if dsn is None
            else Subscriber(
                dsn, on_notice=self._noticed, on_connect=self._connected, on_tick=self._tick
            )
        )

    # -- the carrying process --------------------------------------------------------------

    @contextmanager
    def stream(self, run_id: str, step: int) -> Iterator[Callable[[str], None]]:
        """A model call of ``run_id``'s step ``step``: hand its text, piece by piece, to the
        callable; the call has ended when the block does."""
        text = _Text(step=step, gen=secrets.token_hex(4))
        local = _Local(text)
        with self._lock:
            run = self._runs.setdefault(run_id, _Run(run_id))
            run.local = local
            first = not self._carrying()
            self._streaming += 1
        if first:
            self._listen()

        def write(piece: str) -> None:
            if not piece:
                return
            with self._lock:
                self._advance(run, text.step, text.gen, text.length, piece, own=text)
                if self._wanted.get(run_id, 0.0) > time.monotonic():
                    self._dirty.add(run_id)
                else:
                    return
            self._announcer.poke()

        try:
            yield write
        finally:
            with self._lock:
                self._streaming -= 1
                self._streamed_at = time.monotonic()
                text.ended = True
                wanted = bool(text.length) and self._wanted.get(run_id, 0.0) > time.monotonic()
                if wanted:
                    self._dirty.add(run_id)  # what is unsent, then its end marker
                elif run.local is local:
                    run.local = None
                    self._prune(run_id)
            if wanted:
                self._announcer.poke()

    def quiet(self) -> None:
        """Stop listening and sending (both start again on next use)."""
        with self._lock:
            self._streamed_at = -LINGER_S
        if self._subscriber is not None:
            self._subscriber.want(frozenset())
        self._announcer.stop()

    # -- watchers in this process ----------------------------------------------------------

    def subscribe(self, run_id: str, wake: Callable[[], None]) -> DeltaSubscription:
        """A queue of ``run_id``'s deltas from now on, starting with the text so far of a
        step being generated (if it has any)."""
        sub = DeltaSubscription(self, run_id, wake)
        with self._lock:
            run = self._runs.setdefault(run_id, _Run(run_id))
            run.watchers.add(sub)
            text = run.text
            if text is not None and not text.ended and text.length:
                sub.offer(_delta(run_id, text, 0, text.whole(), catch_up=True))
            if self._subscriber is not None and run.local is None:
                self._asks.add(run_id)
        self._listen()
        return sub

    def unsubscribe(self, sub: DeltaSubscription) -> None:
        with self._lock:
            run = self._runs.get(sub.run_id)
            if run is not None:
                run.watchers.discard(sub)
                self._prune(sub.run_id)
        self._listen()

    def drain(self, sub: DeltaSubscription) -> list[Delta]:
        with self._lock:
            taken = sub.drained()
            if sub.behind:
                sub.behind = False
                run = self._runs.get(sub.run_id)
                text = None if run is None else run.text
                if text is not None and not text.ended and text.length:
                    whole = text.whole()
                    taken.append(
                        Delta(
                            run_id=sub.run_id,
                            step=text.step,
                            offset=0,
                            text=whole,
                            catch_up=True,
                            dropped=True,
                        )
                    )
            return taken

    # -- under the lock ----------------------------------------------------------------------

    def _advance(
        self, run: _Run, step: int, gen: str, offset: int, piece: str, *, own: _Text | None = None
    ) -> bool:
        """Add ``piece`` (at ``offset`` of generation ``gen``) to what this process holds of
        the run and hand what is new to its watchers; False if it does not follow (a gap)."""
        text = run.text
        if text is None or text.step != step or text.gen != gen:
            if offset != 0:
                return False  # the start of that generation was missed
            text = run.text = own or _Text(step=step, gen=gen)
        if text.ended and own is None:
            return True
        if offset > text.length:
            return False
        if offset + len(piece) <= text.length:
            return True  # a repeat of what it holds
        piece = piece[text.length - offset :]
        offset = text.length
        text.parts.append(piece)
        text.length += len(piece)
        for sub in run.watchers:
            sub.offer(_delta(run.run_id, text, offset, piece))
        return True

    def _prune(self, run_id: str) -> None:
        run = self._runs.get(run_id)
        if run is not None and not run.watchers and run.local is None:
            del self._runs[run_id]

    # -- other processes (PostgreSQL) --------------------------------------------------------

    def _listen(self) -> None:
        """Listen to what this process needs: asks while it carries steps (and for
        ``LINGER_S`` after: a worker listens on between them); deltas while it has
        watchers."""
        if self._subscriber is None:
            return
        with self._lock:
            channels = set()
            if self._carrying():
                channels.add(WATCH_CHANNEL)
            if any(run.watchers for run in self._runs.values()):
                channels.add(DELTAS_CHANNEL)
            asks = bool(self._asks) and self._subscriber.connected
        self._subscriber.want(frozenset(channels))
        if asks:
            self._announcer.poke()

    def _noticed(self, channel: str, payload: str) -> None:
        if channel == WATCH_CHANNEL:
            self._asked(payload)
        elif channel == DELTAS_CHANNEL:
            self._received(payload)

    def _asked(self, run_id: str) -> None:
        """Another process watches ``run_id``: send its text (again, from 0) if we carry it."""
        now = time.monotonic()
        with self._lock:
            if len(self._wanted) > 10_000:
                self._wanted = {r: t for r, t in self._wanted.items() if t > now}
            self._wanted[run_id] = now + INTEREST_TTL_S
            run = self._runs.get(run_id)
            local = None if run is None else run.local
            if local is None or not local.text.length:
                return
            local.resend = True
            self._dirty.add(run_id)
        self._announcer.poke()

    def _received(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            if data.get("roll"):  # a process that carries steps began to listen
                self._ask_all()
                return
            run_id, step, gen = str(data["r"]), int(data["s"]), str(data["g"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not ours
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.watchers:
                return
            if data.get("e"):
                if run.text is not None and run.text.gen == gen:
                    run.text.ended = True
                return
            follows = self._advance(run, step, gen, int(data.get("o", 0)), str(data.get("t", "")))
            if not follows:
                self._asks.add(run_id)
        if not follows:
            self._announcer.poke()

    def _connected(self) -> None:
        """The listener (re)connected, or listens to more: asks sent meanwhile were missed,
        so ask again for every run watched here, and, once it carries steps, have every
        watching process ask again (a roll call on ``DELTAS_CHANNEL``)."""
        with self._lock:
            self._roll_call = self._carrying()
        self._ask_all()
        self._announcer.poke()

    def _ask_all(self) -> None:
        """Ask again for every run watched here."""
        with self._lock:
            self._asks |= {r for r, run in self._runs.items() if run.watchers and not run.local}
            self._asked_at = time.monotonic()
            asks = bool(self._asks)
        if asks:
            self._announcer.poke()

    def _carrying(self) -> bool:
        """Whether this process carries steps now or did within ``LINGER_S`` (under the
        lock, or racy harmlessly: a wrong answer costs one tick)."""
        return bool(self._streaming) or time.monotonic() - self._streamed_at < LINGER_S

    def _tick(self) -> None:
        if time.monotonic() - self._asked_at >= INTEREST_S:
            self._ask_all()
            self._listen()  # stop listening to asks once it no longer carries steps

    def _notices(self) -> list[tuple[str, str]]:
        """The announcer's batch: asks, then the text of the steps watched elsewhere."""
        with self._lock:
            connected = self._subscriber is not None and self._subscriber.connected
            notices = [(WATCH_CHANNEL, r) for r in sorted(self._asks)] if connected else []
            if connected:
                self._asks.clear()
                if self._roll_call:
                    self._roll_call = False
                    notices.append((DELTAS_CHANNEL, _ROLL_CALL))
            for run_id in sorted(self._dirty):
                run = self._runs.get(run_id)
                if run is not None and run.local is not None:
                    notices += self._unsent(run_id, run)
            self._dirty.clear()
            return notices

    def _unsent(self, run_id: str, run: _Run) -> list[tuple[str, str]]:
        """What of the run's local step is not yet sent; its end marker once it ended."""
        local = run.local
        assert local is not None
        text = local.text
        if local.resend:
            local.resend, local.sent_parts, local.sent_length = False, 0, 0
        piece = "".join(text.parts[local.sent_parts :])
        notices = [(DELTAS_CHANNEL, p) for p in _payloads(run_id, text, local.sent_length, piece)]
        local.sent_parts, local.sent_length = len(text.parts), text.length
        if text.ended and not local.end_sent:
            local.end_sent = True
            head = {"r": run_id, "s": text.step, "g": text.gen, "e": 1}
            notices.append((DELTAS_CHANNEL, json.dumps(head, separators=(",", ":"))))
            run.local = None
            self._prune(run_id)
        return notices


def _delta(run_id: str, text: _Text, offset: int, piece: str, *, catch_up: bool = False) -> Delta:
    return Delta(run_id=run_id, step=text.step, offset=offset, text=piece, catch_up=catch_up)


def _payloads(run_id: str, text: _Text, offset: int, piece: str) -> list[str]:
    """``piece`` at ``offset`` as notice payloads, each under ``PAYLOAD_BYTES``."""
    if not piece:
        return []
    head: dict[str, Any] = {"r": run_id, "s": text.step, "g": text.gen, "o": offset}
    payload = json.dumps({**head, "t": piece}, ensure_ascii=False, separators=(",", ":"))
    if len(payload.encode()) <= PAYLOAD_BYTES or len(piece) == 1:
        return [payload]
    half = len(piece) // 2
    return _payloads(run_id, text, offset, piece[:half]) + _payloads(
        run_id, text, offset + half, piece[half:]
    )


_HUBS: dict[str, DeltaHub] = {}
_HUBS_LOCK = threading.Lock()


def hub_for(store: Store) -> DeltaHub:
    """The hub of ``store``'s database in this process (one for every engine on it), held
    until ``release``."""
    key = store.engine.url.render_as_string(hide_password=False)
    with _HUBS_LOCK:
        hub = _HUBS.get(key)
        if hub is None:
            hub = _HUBS[key] = DeltaHub(store.listen_dsn())
        hub.holders += 1
        return hub


def release(hub: DeltaHub) -> None:
    """One holder of ``hub`` is done (an engine closed): the last one stops its listening
    and sending, so no connection stays open to a database nobody here uses. A hub used
    again listens again."""
    with _HUBS_LOCK:
        hub.holders -= 1
        last = hub.holders <= 0
    if last:
        hub.quiet()
