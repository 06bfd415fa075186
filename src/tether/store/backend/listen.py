"""PostgreSQL's notification channels, and listening on them from an event loop.

Four channels. ``RUNS_CHANNEL``, on which a run that became ready is announced (the
dialect's ``wake``; idle workers listen), and ``EVENTS_CHANNEL``, on which a run that was
given events is announced with its id as the payload (``announce``; live event streams
listen); ``DELTAS_CHANNEL`` and ``WATCH_CHANNEL`` carry the model's text as it is written
between processes (the deltas hub, a ``listening.Subscriber`` whose channels change as it
runs). Everything that listens in a process shares one connection per database
(``tether.store.backend.listening``); ``listen`` is its form for a task on an event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tether.errors import DatabaseUnavailable
from tether.store.backend.listening import Subscriber

# A run became ready for a worker (payload empty).
RUNS_CHANNEL = "tether_runs"
# A run was given events (payload: its id).
EVENTS_CHANNEL = "tether_events"
# The model's text of a step in flight, for watchers in other processes (reference §16;
# payload: a JSON delta, ``tether._runtime.live.deltas``).
DELTAS_CHANNEL = "tether_deltas"
# A watcher's process wants a run's deltas, and its text so far (payload: the run's id).
WATCH_CHANNEL = "tether_watch"

# The payload of the call made on connecting: "anything may have happened meanwhile".
CONNECTED = ""


async def listen(dsn: str, on_notice: Callable[[str], None], channel: str = RUNS_CHANNEL) -> None:
    """Call ``on_notice(payload)`` (on the running event loop) on each notice of
    ``channel``, and ``on_notice(CONNECTED)`` once it is listened to, until cancelled, on
    the process's shared connection. A lost connection (or one that cannot be opened)
    raises ``DatabaseUnavailable`` here (the driver's error as its cause), so the caller
    logs it and listens again."""
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()

    def later(call: Callable[..., None], *args: object) -> None:
        try:
            loop.call_soon_threadsafe(call, *args)
        except RuntimeError:  # the event loop closed under us: nobody listens here now
            sub.close()

    def failed(exc: BaseException) -> None:
        if not lost.done():  # an error of its own: each listener raises it in its task
            gone = DatabaseUnavailable("the LISTEN connection failed or could not be opened")
            gone.__cause__ = exc
            lost.set_exception(gone)

    sub = Subscriber(
        dsn,
        on_notice=lambda _channel, payload: later(on_notice, payload),
        on_connect=lambda: later(on_notice, CONNECTED),
        on_lost=lambda exc: later(failed, exc),
    )
    sub.want(frozenset({channel}))
    try:
        await lost
    finally:
        sub.close()
        lost.cancel()  # cancelled: nobody awaits a loss now
