"""Waking idle workers on PostgreSQL: ``LISTEN tether_runs`` on a connection of its own,
in a thread of its own, calling back into the event loop on each notice."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg

from tether.store.dialect import CHANNEL


async def listen(dsn: str, wake: Callable[[], None]) -> None:
    """Call ``wake`` (on the running event loop) on each notice, and once on connecting,
    until cancelled. A lost connection raises here, so the caller's monitor logs it and
    listens again."""
    loop = asyncio.get_running_loop()
    done = threading.Event()

    def woken() -> None:
        loop.call_soon_threadsafe(wake)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-listen")
    try:
        await loop.run_in_executor(pool, _listen, dsn, woken, done)
    finally:
        done.set()  # a cancelled wait leaves the thread running: tell it to return
        pool.shutdown(wait=False)


def _listen(dsn: str, wake: Callable[[], None], done: threading.Event) -> None:
    """Block on ``LISTEN`` until ``done``; call ``wake`` on each notice (and once on
    connecting, for notices sent while no connection listened)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        try:
            wake()
            while not done.is_set():
                for _ in conn.notifies(timeout=1.0, stop_after=1):
                    wake()
        except RuntimeError:
            return  # the event loop closed under us
