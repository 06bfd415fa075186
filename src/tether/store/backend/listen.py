"""PostgreSQL's notification channels, and listening on them.

Four channels. ``RUNS_CHANNEL``, on which a run that became ready is announced (the
dialect's ``wake``; idle workers listen), and ``EVENTS_CHANNEL``, on which a run that was
given events is announced with its id as the payload (``announce``; live event streams
listen); ``DELTAS_CHANNEL`` and ``WATCH_CHANNEL`` carry the model's text as it is written
between processes (``Subscriber``, whose channels change as it runs). ``listen`` runs
``LISTEN`` on a connection of its own, in a thread of its own, calling back into the event
loop with each notice's payload. psycopg is imported only
when a listener connects: SQLite stores never load it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

# A run became ready for a worker (payload empty).
RUNS_CHANNEL = "tether_runs"
# A run was given events (payload: its id).
EVENTS_CHANNEL = "tether_events"

# The payload of the call made on connecting: "anything may have happened meanwhile".
CONNECTED = ""


async def listen(dsn: str, on_notice: Callable[[str], None], channel: str = RUNS_CHANNEL) -> None:
    """Call ``on_notice(payload)`` (on the running event loop) on each notice of
    ``channel``, and ``on_notice(CONNECTED)`` once on connecting, until cancelled. A lost
    connection raises here, so the caller logs it and listens again."""
    loop = asyncio.get_running_loop()
    done = threading.Event()

    def noticed(payload: str) -> None:
        loop.call_soon_threadsafe(on_notice, payload)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-listen")
    try:
        await loop.run_in_executor(pool, _listen, dsn, channel, noticed, done)
    finally:
        done.set()  # a cancelled wait leaves the thread running: tell it to return
        pool.shutdown(wait=False)


def _listen(
    dsn: str, channel: str, on_notice: Callable[[str], None], done: threading.Event
) -> None:
    """Block on ``LISTEN`` until ``done``; call ``on_notice`` with each notice's payload
    (and with ``CONNECTED`` once on connecting, for notices sent while none listened)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        try:
            on_notice(CONNECTED)
            while not done.is_set():
                for notice in conn.notifies(timeout=1.0, stop_after=1):
                    on_notice(notice.payload)
        except RuntimeError:
            return  # the event loop closed under us


# The model's text of a step in flight, for watchers in other processes (reference §16;
# payload: a JSON delta, ``tether._runtime.live.deltas``).
DELTAS_CHANNEL = "tether_deltas"
# A watcher's process wants a run's deltas, and its text so far (payload: the run's id).
WATCH_CHANNEL = "tether_watch"

TICK_S = 0.25  # how often the subscriber's thread looks at what it should listen to


class Subscriber:
    """A ``LISTEN`` connection whose channels change as it runs, in a thread of its own:
    ``want(channels)`` sets them (the thread starts on the first channel and ends, closing
    its connection, once none is wanted). Its callbacks run on that thread:
    ``on_notice(channel, payload)`` for each notice, ``on_connect()`` once the wanted
    channels are listened to after a (re)connection (notices sent before were missed), and
    ``on_tick()`` about every ``TICK_S``. A lost connection is logged and opened again
    after ``RELISTEN_S``."""

    RELISTEN_S = 1.0

    def __init__(
        self,
        dsn: str,
        *,
        on_notice: Callable[[str, str], None],
        on_connect: Callable[[], None],
        on_tick: Callable[[], None],
    ) -> None:
        self._dsn = dsn
        self._on_notice = on_notice
        self._on_connect = on_connect
        self._on_tick = on_tick
        self._wanted: frozenset[str] = frozenset()
        self._listening: frozenset[str] = frozenset()  # on the thread's connection now
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def connected(self) -> bool:
        """Whether every wanted channel is listened to now (a notice sent from now on on
        any of them comes back here). It follows the thread's connection, not the last
        ``want``: channels let go of and wanted again before the thread saw it were never
        unlistened."""
        with self._lock:
            return bool(self._wanted) and self._wanted <= self._listening

    def want(self, channels: frozenset[str]) -> None:
        """Listen to ``channels`` from now on (within about ``TICK_S``)."""
        with self._lock:
            self._wanted = channels
            if channels and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(
                    target=self._run, name="tether-subscribe", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        import psycopg

        while True:
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    if not self._serve(conn):
                        return
            except psycopg.Error as exc:
                with self._lock:
                    self._listening = frozenset()
                    if not self._wanted:  # let go of meanwhile (its database may be gone)
                        self._thread = None
                        return
                log.warning("subscriber lost: %s", exc, extra={"action": "listen_lost"})
            with self._lock:
                self._listening = frozenset()
            time.sleep(self.RELISTEN_S)
            self._on_tick()  # its owner may no longer want anything: then it stops here
            with self._lock:
                if not self._wanted:
                    self._thread = None
                    return

    def _serve(self, conn: psycopg.Connection[Any]) -> bool:
        """Listen on ``conn`` until nothing is wanted (False) or the connection fails."""
        from psycopg import sql

        listening: frozenset[str] = frozenset()
        while True:
            with self._lock:
                wanted = self._wanted
                if not wanted:
                    self._thread = None
                    self._listening = frozenset()
                    return False
            if wanted != listening:
                for channel in sorted(listening - wanted):
                    conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
                for channel in sorted(wanted - listening):
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                added = bool(wanted - listening)
                listening = wanted
                with self._lock:
                    self._listening = listening
                if added:
                    self._on_connect()
            for notice in conn.notifies(timeout=TICK_S, stop_after=1):
                self._on_notice(notice.channel, notice.payload)
            self._on_tick()
