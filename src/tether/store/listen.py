"""PostgreSQL's notification channels, and listening on them.

Two channels: ``RUNS_CHANNEL``, on which a run that became ready is announced (the
dialect's ``wake``; idle workers listen), and ``EVENTS_CHANNEL``, on which a run that was
given events is announced with its id as the payload (``announce``; live event streams
listen). ``listen`` runs ``LISTEN`` on a connection of its own, in a thread of its own,
calling back into the event loop with each notice's payload. psycopg is imported only
when a listener connects: SQLite stores never load it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

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
