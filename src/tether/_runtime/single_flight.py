"""Identical store calls made concurrently in one process, sent once ("single flight").

Fifty approvers clicking one link at once reach one process as fifty requests. Each would
read the token, then send the conditional UPDATE that claims it; all but one UPDATE wait
on the run's row lock only to match nothing, and then read again to learn who won. Here
the first caller of a key sends the call and the others that arrive while it is in
flight await its result instead. Only calls whose result a later caller would have got
anyway may share it (see ``decided_call.py``): the database still decides every claim.

Thread-safe, and usable from several event loops at once (``SyncEngine`` runs each call
in a loop of its own): results travel in ``concurrent.futures`` futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class _LeaderFailed(Exception):
    """The call in flight raised: whoever waited on it makes the call itself."""


class InFlight:
    """The calls in flight, by key; a call's followers share its result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, concurrent.futures.Future[Any]] = {}
        self._sharing: dict[Hashable, int] = {}

    def sharing(self, key: Hashable) -> int:
        """How many callers wait on the call of ``key`` in flight (for observation)."""
        with self._lock:
            return self._sharing.get(key, 0)

    async def run(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """``call()``'s result, or that of the call of ``key`` already in flight; and
        whether this caller made the call (False: it shares another caller's result). A
        call that raises is not shared: its followers make the call themselves."""
        with self._lock:
            shared = self._calls.get(key)
            if shared is None:
                mine: concurrent.futures.Future[Any] = concurrent.futures.Future()
                self._calls[key] = mine
                self._sharing[key] = 0
            else:
                self._sharing[key] += 1
        if shared is not None:
            try:
                return await asyncio.wrap_future(shared), False
            except _LeaderFailed:
                return await call(), True
        try:
            result = await call()
        except BaseException:
            mine.set_exception(_LeaderFailed())
            raise
        finally:
            with self._lock:
                del self._calls[key]
                del self._sharing[key]
        mine.set_result(result)
        return result, True
