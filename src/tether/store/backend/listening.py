"""One ``LISTEN`` connection per database in a process, shared by everything that listens.

PostgreSQL wakes every listening connection of a database on each ``NOTIFY``, whatever
channels it listens to, so each one a process holds costs the server work on every
notice. The claim loop (``RUNS_CHANNEL``), the live event feed (``EVENTS_CHANNEL``) and the
deltas hub (``DELTAS_CHANNEL``, ``WATCH_CHANNEL``) of a process therefore share one
``Listener`` per listen DSN (``listener_for``): one psycopg connection, named
``APPLICATION_NAME`` in ``pg_stat_activity``, in one thread, listening to the union of the
channels its ``Subscriber``s want, open while any of them wants one and closed once none
does.

Each subscriber's callbacks run on that thread (callers on an event loop hop back with
``call_soon_threadsafe``, ``listen.listen``): ``on_notice(channel, payload)`` for each notice
of a channel it wants, in the order PostgreSQL sent them; ``on_connect()`` once every channel
it wants is listened to after it asked for one it was not told of, or after a
reconnection (notices sent before were missed: "anything may have happened meanwhile");
``on_tick()`` about every ``TICK_S`` while it wants something; ``on_lost(error)`` when the
connection failed or could not be opened. A lost connection is logged once and opened again
after ``RELISTEN_S`` while anyone still wants a channel. psycopg is imported only when the
thread connects: SQLite stores never load it.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# What the shared connection is called in ``pg_stat_activity`` (docs/operations.md).
APPLICATION_NAME = "tether-listen"
TICK_S = 0.25  # how often the subscribers' ``on_tick`` runs while they want a channel
RELISTEN_S = 1.0  # after a lost connection (or one that could not be opened)


class Subscriber:
    """One user of the process's ``LISTEN`` connection to ``dsn`` (see the module): it
    wants no channel until ``want`` says which."""

    def __init__(
        self,
        dsn: str,
        *,
        on_notice: Callable[[str, str], None],
        on_connect: Callable[[], None],
        on_tick: Callable[[], None] | None = None,
        on_lost: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.listener = listener_for(dsn)
        self.on_notice = on_notice
        self.on_connect = on_connect
        self.on_tick = on_tick
        self.on_lost = on_lost

    @property
    def connected(self) -> bool:
        """Whether every channel it wants is listened to now (a notice sent from now on on
        any of them comes here). It follows the connection, not the last ``want``: channels
        let go of and wanted again before the thread saw it were never unlistened."""
        return self.listener.connected(self)

    def want(self, channels: frozenset[str]) -> None:
        """Listen to ``channels`` from now on (none: let go; the connection closes once no
        subscriber wants any)."""
        self.listener.want(self, channels)

    def close(self) -> None:
        """Want nothing more (the same as ``want(frozenset())``)."""
        self.listener.want(self, frozenset())


class Listener:
    """The ``LISTEN`` connection of this process to one database (see the module)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._lock = threading.Lock()
        self._wanted: dict[Subscriber, frozenset[str]] = {}  # those that want a channel
        self._told: dict[Subscriber, frozenset[str]] = {}  # of this connection, by on_connect
        self._listening: frozenset[str] = frozenset()  # on the thread's connection now
        self._thread: threading.Thread | None = None
        self._waker: _Waker | None = None  # the running thread's, to look again at once

    @property
    def listening(self) -> frozenset[str]:
        """The channels listened to on its connection now (none while it is not open)."""
        with self._lock:
            return self._listening

    @property
    def running(self) -> bool:
        """Whether its thread runs (it holds its connection, or is about to open one)."""
        with self._lock:
            return self._thread is not None

    def connected(self, sub: Subscriber) -> bool:
        with self._lock:
            wanted = self._wanted.get(sub, frozenset())
            return bool(wanted) and wanted <= self._listening

    def want(self, sub: Subscriber, channels: frozenset[str]) -> None:
        """``sub`` wants ``channels`` from now on; the thread starts if it is the first to
        want one, and looks again at once otherwise."""
        with self._lock:
            if channels:
                self._wanted[sub] = channels
            else:
                self._wanted.pop(sub, None)
                self._told.pop(sub, None)
            if self._thread is not None and self._thread.is_alive():
                if self._waker is not None:
                    self._waker.poke()
            elif channels:
                self._waker = _Waker()
                self._thread = threading.Thread(
                    target=self._run, args=(self._waker,), name="tether-listen", daemon=True
                )
                self._thread.start()

    # -- the thread --------------------------------------------------------------------------

    def _run(self, waker: _Waker) -> None:
        """Hold the connection while anyone wants a channel; open it again after a loss."""
        import psycopg

        try:
            while True:
                try:
                    with psycopg.connect(
                        self.dsn, autocommit=True, application_name=APPLICATION_NAME
                    ) as conn:
                        self._serve(conn, waker)
                        return
                except Exception as exc:  # lost, refused, or a bug: said, and tried again
                    self._lost(exc)
                self._pause()
                self._tick()  # a subscriber may let go on its tick: then it stops here
                if self._idle(waker):
                    return
        finally:
            waker.close()

    def _pause(self) -> None:
        """The wait before opening a lost connection again."""
        time.sleep(RELISTEN_S)

    def _serve(self, conn: psycopg.Connection[Any], waker: _Waker) -> None:
        """Listen on ``conn`` until nothing is wanted (it returns) or the connection fails
        (it raises)."""
        listening: frozenset[str] = frozenset()
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(waker.fileno(), selectors.EVENT_READ)
            ticked = time.monotonic()
            while True:
                wanted = self._looking()
                if not wanted:
                    if self._idle(waker):
                        return
                    continue  # wanted again as it was about to end
                if wanted != listening:
                    _relisten(conn, listening, wanted)
                    listening = wanted
                self._connected(listening)
                self._dispatch(list(conn.notifies(timeout=0)))
                if time.monotonic() - ticked >= TICK_S:
                    ticked = time.monotonic()
                    self._tick()
                for key, _events in selector.select(ticked + TICK_S - time.monotonic()):
                    if key.fd == waker.fileno():
                        waker.drain()

    def _looking(self) -> frozenset[str]:
        """The channels wanted now. Those about to be unlistened no longer count as
        listened to, nor as told of to their subscribers (one that wants them again is
        told again once they are)."""
        with self._lock:
            wanted = frozenset[str]().union(*self._wanted.values())
            self._listening &= wanted
            for sub, told in self._told.items():
                self._told[sub] = told & self._wanted.get(sub, frozenset())
            return wanted

    def _connected(self, listening: frozenset[str]) -> None:
        """``listening`` is listened to: tell each subscriber whose channels all are and
        that was not told of them yet (it missed nothing from now on)."""
        with self._lock:
            self._listening = listening
            told = []
            for sub, wanted in self._wanted.items():
                if wanted <= listening and not wanted <= self._told.get(sub, frozenset()):
                    self._told[sub] = wanted
                    told.append(sub)
        for sub in told:
            _call(sub.on_connect)

    def _dispatch(self, notices: list[psycopg.Notify]) -> None:
        """Hand each notice to the subscribers that want its channel, in order."""
        if not notices:
            return
        with self._lock:
            routes: dict[str, list[Subscriber]] = {}
            for sub, wanted in self._wanted.items():
                for channel in wanted:
                    routes.setdefault(channel, []).append(sub)
        for notice in notices:
            for sub in routes.get(notice.channel, ()):
                _call(sub.on_notice, notice.channel, notice.payload)

    def _tick(self) -> None:
        with self._lock:
            ticking = [sub.on_tick for sub in self._wanted if sub.on_tick is not None]
        for on_tick in ticking:
            _call(on_tick)

    def _lost(self, exc: Exception) -> None:
        """The connection failed or could not be opened: every subscriber is told, and
        nothing counts as listened to until it is open again."""
        with self._lock:
            self._listening = frozenset()
            self._told.clear()
            losing = [sub.on_lost for sub in self._wanted if sub.on_lost is not None]
        told = {"action": "listen_lost", "error_type": type(exc).__name__, "retry_in_s": RELISTEN_S}
        log.warning("listener lost: %s", _first_line(exc), extra=told)
        for on_lost in losing:
            _call(on_lost, exc)

    def _idle(self, waker: _Waker) -> bool:
        """Whether no subscriber wants a channel: then the thread is done (it says so
        under the lock, so a subscriber that comes next starts a thread of its own)."""
        with self._lock:
            if self._wanted:
                return False
            self._listening = frozenset()
            if self._waker is waker:
                self._thread = None
                self._waker = None
            return True


def _relisten(
    conn: psycopg.Connection[Any], listening: frozenset[str], wanted: frozenset[str]
) -> None:
    from psycopg import sql

    for channel in sorted(listening - wanted):
        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
    for channel in sorted(wanted - listening):
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def _call(callback: Callable[..., None], *args: Any) -> None:
    """Run a subscriber's callback; one that fails is logged and harms no other."""
    try:
        callback(*args)
    except Exception as exc:
        frames = "".join(traceback.format_tb(exc.__traceback__))
        told = {"action": "listen_callback_failed", "error_type": type(exc).__name__}
        log.error("a listener's callback failed", extra={**told, "trace": frames})


def _first_line(exc: BaseException) -> str:
    """A connection error's first line (its host and port, never a statement's content)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


class _Waker:
    """A socket pair a thread selects on beside its connection, so that a ``want`` is
    acted on at once rather than at the next tick."""

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)

    def fileno(self) -> int:
        return self._read.fileno()

    def poke(self) -> None:
        with contextlib.suppress(OSError):  # full: a poke is pending already
            self._write.send(b"\0")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            self._read.recv(4096)

    def close(self) -> None:
        self._read.close()
        self._write.close()


_LISTENERS: dict[str, Listener] = {}
_LISTENERS_LOCK = threading.Lock()


def listener_for(dsn: str) -> Listener:
    """The process's listener for ``dsn`` (kept for the life of the process: it holds no
    connection nor thread while nobody listens)."""
    with _LISTENERS_LOCK:
        listener = _LISTENERS.get(dsn)
        if listener is None:
            listener = _LISTENERS[dsn] = Listener(dsn)
        return listener
