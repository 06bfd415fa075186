"""Waiting in tests: polls with a deadline, never a bare sleep as synchronisation, and one
way to run a coroutine from synchronous code.

- ``until``: in async code, await a predicate (async or plain) until it is truthy, without
  blocking the event loop;
- ``poll_until``: in synchronous code (or a thread), the same by blocking;
- ``run_sync``: run a coroutine to its end on an event loop of its own.

Both polls return the truthy value they saw, so a test can wait for a thing and use it, and
fail after ``timeout`` with what they waited for and the last value seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _timed_out(what: str, predicate: object, timeout: float, last: object) -> AssertionError:
    return AssertionError(
        f"timed out after {timeout:g} s waiting for {what or predicate} (last saw {last!r})"
    )


@overload
async def until(
    predicate: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...
@overload
async def until(
    predicate: Callable[[], T | None],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str = ...,
) -> T: ...
async def until(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "",
) -> Any:
    """Poll ``predicate`` (a coroutine function or a plain one) every ``interval`` seconds
    until it returns something truthy, and return that; fail after ``timeout``. An
    ``interval`` of 0 only yields to the other tasks between two tries."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, predicate, timeout, value)
        await asyncio.sleep(interval)


def poll_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and
    return that; fail after ``timeout``. Blocks: for synchronous tests and threads (from a
    coroutine, ``await asyncio.to_thread(poll_until, ...)`` or ``until``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, predicate, timeout, value)
        time.sleep(interval)


def run_sync(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end on an event loop of its own, from synchronous code. Unlike
    ``asyncio.run`` it leaves the current-loop slot alone (``asyncio.run`` clears it, and
    pytest-asyncio < 1.4 then leaks the loop it left there after an async test:
    pytest-dev/pytest-asyncio#724)."""
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        return runner.run(work)
