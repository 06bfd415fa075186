"""The ``DeltaHub`` of one database in a process, and the registry of hubs (``hub_for``,
``release``); see ``tether._runtime.live.deltas``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from tether._runtime.live.deltas.texts import (
    DeltaSubscription,
    Local,
    RunTexts,
    Text,
    delta_of,
    payloads,
)
from tether.results import Delta
from tether.store import Store
from tether.store.backend.announce import Announcer, resolve
from tether.store.backend.listen import DELTAS_CHANNEL, WATCH_CHANNEL
from tether.store.backend.listening import Subscriber

log = logging.getLogger(__name__)

INTEREST_S = 2.0  # a watching process asks again for its runs this often
INTEREST_TTL_S = 3 * INTEREST_S + 1.0  # a carrying process sends a run's text this long after
LINGER_S = 10.0  # a process listens to asks this long after its last model call
_ROLL_CALL = '{"roll":1}'
_KEEP = "~"  # an ask to keep a run's text coming, not to send it again from 0
# How long the text of a burst is gathered into one notice per run (and one transaction of
# notices for all): fewer notices for PostgreSQL to wake its listeners with, for a few ms
# more lag than a shorter batch (benchmarks/README.md, deltas.py, has both).
BATCH_S = 0.025
# How long a step's turn waits for its last text to be committed as notices, and a
# watcher's ``model_turn`` for the deltas before it (both are one round trip unless
# PostgreSQL or the connection is in trouble: then the stream goes on without them).
SEND_S = SYNC_S = 5.0


class DeltaHub:
    """The deltas of every run of one database in this process (see the module)."""

    def __init__(self, dsn: str | None, notify_dsn: str | None = None) -> None:
        """``dsn``: where it listens (PostgreSQL; None on SQLite); ``notify_dsn``: where
        it sends (default ``dsn``), which may be a transaction pooler's."""
        self._lock = threading.Lock()
        self._runs: dict[str, RunTexts] = {}
        self._wanted: dict[str, float] = {}  # run id → until when other processes watch it
        self._dirty: set[str] = set()  # local steps with text (or an end) to send
        self._asks: set[str] = set()  # runs to ask for, their text so far too
        self._keeps: set[str] = set()  # runs to ask for again, only what is new
        self._asked_at = 0.0
        self._syncs: list[Future[None]] = []  # watchers' barriers, their notice not yet sent
        self._synced: dict[str, list[Future[None]]] = {}  # sent: its token → its waiters
        self._streaming = 0  # model calls of this process in flight
        self._streamed_at = -LINGER_S  # when the last one ended
        self.holders = 0  # engines of this process using it (``hub_for``)
        self._roll_call = False  # ask watching processes to ask again (we listen now)
        self._announcer = Announcer(notify_dsn or dsn, batch_s=BATCH_S)
        self._announcer.add_source(self._notices)
        self._subscriber = (
            None
            if dsn is None
            else Subscriber(
                dsn, on_notice=self._noticed, on_connect=self._connected, on_tick=self._tick
            )
        )

    # -- the carrying process --------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def stream(self, run_id: str, step: int) -> AsyncIterator[Callable[[str], None]]:
        """A model call of ``run_id``'s step ``step``: hand its text, piece by piece, to the
        callable; the call has ended when the block does. A block that ends normally (its
        turn is stored next) returns once the step's text, to its end, is committed as
        notices for the processes watching the run, so it precedes the turn's event there
        (``caught_up``); a run nobody watches elsewhere returns at once."""
        text = Text(step=step, gen=secrets.token_hex(4))
        local = Local(text)
        with self._lock:
            run = self._runs.setdefault(run_id, RunTexts(run_id))
            run.local = local
            first = not self._carrying()
            self._streaming += 1
        if first:
            self._listen()

        def write(piece: str) -> None:
            if not piece:
                return
            with self._lock:
                if run.text is text and not run.watchers:  # nobody here to hand it to
                    text.parts.append(piece)
                    text.length += len(piece)
                else:
                    self._advance(run, text.step, text.gen, text.length, piece, own=text)
                wanted = self._wanted  # {} while no other process watches anything
                if (
                    not wanted
                    or run_id in self._dirty
                    or wanted.get(run_id, 0.0) <= time.monotonic()
                ):
                    return  # nobody asked for it, or a batch will send it already
                self._dirty.add(run_id)
            self._announcer.poke()

        try:
            yield write
        finally:
            sending = self._ended(run, local)
        if sending is not None:
            await _within(sending, SEND_S, "a step's last text sent")

    def _ended(self, run: RunTexts, local: Local) -> Future[None] | None:
        """The model call of ``local`` ended: its text, if watched elsewhere, is sent (what
        is unsent, then its end marker) in a batch now, done when the future is."""
        with self._lock:
            self._streaming -= 1
            self._streamed_at = time.monotonic()
            local.text.ended = True
            now = time.monotonic()
            wanted = bool(local.text.length) and self._wanted.get(run.run_id, 0.0) > now
            if wanted:
                self._dirty.add(run.run_id)
            elif run.local is local:
                run.local = None
                self._prune(run.run_id)
        return self._announcer.flush() if wanted else None

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
            run = self._runs.setdefault(run_id, RunTexts(run_id))
            run.watchers.add(sub)
            text = run.text
            caught = None if text is None else text.so_far(run_id)
            if caught is not None:
                sub.offer(caught)
            if self._subscriber is not None and run.local is None:
                live = text is not None and not text.ended  # its text so far is here
                (self._keeps if live else self._asks).add(run_id)
        self._listen()
        return sub

    async def caught_up(self, sub: DeltaSubscription, turns: list[tuple[int, str]]) -> None:
        """Return once every delta of the steps of ``turns`` of ``sub``'s run that reached
        PostgreSQL before now is in ``sub``'s queue: their turns (each step with its text)
        are stored, and the feed sends their ``model_turn`` events next. At once when none
        has text but one this process holds to its end (it carried the step, or the end
        marker came); else once a notice of its own (a sync) came back on
        ``DELTAS_CHANNEL``: PostgreSQL hands a listener notices in the order they were
        committed, and the carrying process commits a step's text before its turn
        (``stream``), so the sync comes after every delta of those steps."""
        if self._subscriber is None:
            return
        with self._lock:
            run = self._runs.get(sub.run_id)
            held = None if run is None or run.text is None or not run.text.ended else run.text
            ended = set() if held is None else {(held.step, held.length)}
            if all(not text or (step, len(text)) in ended for step, text in turns):
                return
            done: Future[None] = Future()
            self._syncs.append(done)
        self._announcer.poke()
        await _within(done, SYNC_S, "the deltas before a model_turn")

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
                caught = None if text is None else text.so_far(sub.run_id, dropped=True)
                if caught is not None:
                    taken.append(caught)
            return taken

    # -- under the lock ----------------------------------------------------------------------

    def _advance(
        self,
        run: RunTexts,
        step: int,
        gen: str,
        offset: int,
        piece: str,
        *,
        own: Text | None = None,
    ) -> bool:
        """Add ``piece`` (at ``offset`` of generation ``gen``) to what this process holds of
        the run and hand what is new to its watchers; False if it does not follow (a gap)."""
        text = run.text
        if text is None or text.step != step or text.gen != gen:
            if offset != 0:
                return False  # the start of that generation was missed
            text = run.text = own or Text(step=step, gen=gen)
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
            sub.offer(delta_of(run.run_id, text, offset, piece))
        return True

    def _prune(self, run_id: str) -> None:
        run = self._runs.get(run_id)
        if run is not None and not run.watchers and run.local is None:
            del self._runs[run_id]

    # -- other processes (PostgreSQL) --------------------------------------------------------

    def _listen(self) -> None:
        """Listen to what this process needs: asks while it carries steps (and for
        ``LINGER_S`` after: a worker listens on between them); deltas while it has
        watchers. The channels are set under the lock, so two calls (a watcher arriving
        as the listener's tick looks) cannot leave the older set in place; asks go at once
        if the listener listens to them already (channels let go of and wanted again before
        its thread saw it, or the process's connection listens to them for another hub), else
        once it does (``_connected``)."""
        if self._subscriber is None:
            return
        with self._lock:
            channels = set()
            if self._carrying():
                channels.add(WATCH_CHANNEL)
            if any(run.watchers for run in self._runs.values()):
                channels.add(DELTAS_CHANNEL)
            self._subscriber.want(frozenset(channels))
            asks = bool(self._asks or self._keeps) and self._subscriber.connected
        if asks:
            self._announcer.poke()

    def _noticed(self, channel: str, payload: str) -> None:
        if channel == WATCH_CHANNEL:
            keep = payload.startswith(_KEEP)
            self._asked(payload.removeprefix(_KEEP), keep=keep)
        elif channel == DELTAS_CHANNEL:
            self._received(payload)

    def _asked(self, run_id: str, *, keep: bool = False) -> None:
        """Another process watches ``run_id``: send its text (again, from 0) if we carry it;
        to ``keep`` it sent, only what is new, unless it was no longer sent."""
        now = time.monotonic()
        with self._lock:
            if len(self._wanted) > 10_000:
                self._wanted = {r: t for r, t in self._wanted.items() if t > now}
            sent = self._wanted.get(run_id, 0.0) > now
            self._wanted[run_id] = now + INTEREST_TTL_S
            if keep and sent:
                return
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
                self._ask_all(resend=True)
                return
            if "sync" in data:  # every notice committed before it has come
                with self._lock:
                    waiting = self._synced.pop(str(data["sync"]), [])
                resolve(waiting)
                return
            run_id, step, gen = str(data["r"]), int(data["s"]), str(data["g"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not ours
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.watchers:
                return
            piece = str(data.get("t", ""))
            follows = not piece or self._advance(run, step, gen, int(data.get("o", 0)), piece)
            if not follows:
                self._asks.add(run_id)
            elif data.get("e") and run.text is not None and run.text.gen == gen:
                run.text.ended = True
        if not follows:
            self._announcer.poke()

    def _connected(self) -> None:
        """The listener (re)connected, or listens to more: asks sent meanwhile were missed,
        so ask again for every run watched here, and, once it carries steps, have every
        watching process ask again (a roll call on ``DELTAS_CHANNEL``)."""
        with self._lock:
            self._roll_call = self._carrying()
            for waiting in self._synced.values():  # their syncs may have come unheard
                self._syncs += waiting
            self._synced.clear()
        self._ask_all(resend=True)
        self._announcer.poke()

    def _ask_all(self, *, resend: bool) -> None:
        """Ask again for every run watched here: with its text so far if ``resend``, else
        to keep it coming."""
        with self._lock:
            watched = {r for r, run in self._runs.items() if run.watchers and not run.local}
            if resend:
                self._asks |= watched
            else:
                self._keeps |= watched - self._asks
            self._asked_at = time.monotonic()
            asks = bool(self._asks or self._keeps)
        if asks:
            self._announcer.poke()

    def _carrying(self) -> bool:
        """Whether this process carries steps now or did within ``LINGER_S`` (under the
        lock, or racy harmlessly: a wrong answer costs one tick)."""
        return bool(self._streaming) or time.monotonic() - self._streamed_at < LINGER_S

    def _tick(self) -> None:
        if time.monotonic() - self._asked_at >= INTEREST_S:
            self._ask_all(resend=False)
            self._listen()  # stop listening to asks once it no longer carries steps

    def _notices(self) -> list[tuple[str, str]]:
        """The announcer's batch: asks, then the text of the steps watched elsewhere."""
        with self._lock:
            connected = self._subscriber is not None and self._subscriber.connected
            notices = [(WATCH_CHANNEL, r) for r in sorted(self._asks)] if connected else []
            if connected:
                keeps = sorted(self._keeps - self._asks)
                notices += [(WATCH_CHANNEL, _KEEP + r) for r in keeps]
                self._asks.clear()
                self._keeps.clear()
                if self._roll_call:
                    self._roll_call = False
                    notices.append((DELTAS_CHANNEL, _ROLL_CALL))
                notices += self._sync()
            for run_id in sorted(self._dirty):
                run = self._runs.get(run_id)
                if run is not None and run.local is not None:
                    notices += self._unsent(run_id, run)
            self._dirty.clear()
            return notices

    def _sync(self) -> list[tuple[str, str]]:
        """The notice of the barriers asked since the last batch (one for all of them)."""
        self._synced = {t: w for t, w in self._synced.items() if not all(f.done() for f in w)}
        waiting = [f for f in self._syncs if not f.done()]  # those given up are dropped
        self._syncs = []
        if not waiting:
            return []
        token = secrets.token_hex(8)
        self._synced[token] = waiting
        return [(DELTAS_CHANNEL, json.dumps({"sync": token}))]

    def _unsent(self, run_id: str, run: RunTexts) -> list[tuple[str, str]]:
        """What of the run's local step is not yet sent; its end marker once it ended."""
        local = run.local
        assert local is not None
        text = local.text
        if local.resend:
            local.resend, local.sent_parts, local.sent_length = False, 0, 0
        piece = "".join(text.parts[local.sent_parts :])
        ends = text.ended and not local.end_sent  # the end marker rides on the last notice
        sent = payloads(run_id, text, local.sent_length, piece, ends=ends)
        local.sent_parts, local.sent_length = len(text.parts), text.length
        if ends:
            local.end_sent = True
            run.local = None
            self._prune(run_id)
        return [(DELTAS_CHANNEL, p) for p in sent]


async def _within(done: Future[None], timeout: float, what: str) -> None:
    """Wait for ``done`` (resolved on another thread), at most ``timeout`` seconds: the
    stream goes on without ``what`` then (the stored turn still holds the whole text)."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(done), timeout)
    except TimeoutError:
        log.warning("deltas: gave up waiting for %s", what, extra={"action": "deltas_late"})


_HUBS: dict[str, DeltaHub] = {}
_HUBS_LOCK = threading.Lock()


def hub_for(store: Store) -> DeltaHub:
    """The hub of ``store``'s database in this process (one for every engine on it), held
    until ``release``."""
    key = store.engine.url.render_as_string(hide_password=False)
    with _HUBS_LOCK:
        hub = _HUBS.get(key)
        if hub is None:
            hub = _HUBS[key] = DeltaHub(store.listen_dsn(), store.notify_dsn())
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
