"""A tool call bounded by its timeout (SPEC §10), and never waited on once it overran.

An ``async def`` runs as a task, cancelled at the timeout (it stops at its next await). A
plain function runs in a daemon thread of its own, not in the event loop's executor: the
heartbeat and the tools' checks share that executor, and a process joins its threads at
exit, so a function that never returns would starve the one and hang the other. A thread
cannot be stopped: once it overran, its result is dropped and nothing waits for it.
``still_running`` tells whether an overrun write is still at work, so that reconciling it
does not take "absent" for an answer while it may yet take effect.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
# Idempotency key → whether each overrun call with that key is still at work.
_overrun: dict[str, list[Callable[[], bool]]] = {}


async def within(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    timeout_s: float,
    key: str | None = None,
) -> Any:
    """``fn(*args, **kwargs)``'s answer, or ``TimeoutError`` after ``timeout_s`` seconds.
    An overrun call is left behind (cancelled if it is a coroutine); with ``key`` it is
    remembered until it ends (``still_running``)."""
    finished = threading.Event()
    if inspect.iscoroutinefunction(fn):
        finished.set()  # nothing outside the task: the task's end is the call's end
        task = asyncio.ensure_future(fn(*args, **kwargs))
    else:
        task = asyncio.ensure_future(_plain(fn, args, kwargs, finished))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except BaseException:  # the caller was cancelled: so is the call
        task.cancel()
        raise
    if done:
        return task.result()
    task.cancel()
    task.add_done_callback(_dropped)
    if key is not None:
        _remember(key, lambda: not (task.done() and finished.is_set()))
    name = getattr(fn, "__name__", "the tool")
    raise TimeoutError(f"{name} did not answer within {timeout_s:g} s")


def still_running(key: str) -> bool:
    """Whether a call with idempotency key ``key`` overran its timeout and is still at
    work in this process (it may yet take effect)."""
    with _lock:
        return any(alive() for alive in _overrun.get(key, ()))


def _remember(key: str, alive: Callable[[], bool]) -> None:
    with _lock:
        for other in [k for k, checks in _overrun.items() if not any(c() for c in checks)]:
            del _overrun[other]  # calls that ended since: forgotten
        _overrun.setdefault(key, []).append(alive)


async def _plain(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], finished: threading.Event
) -> Any:
    value = await _in_daemon_thread(fn, args, kwargs, finished)
    if inspect.isawaitable(value):
        return await value
    return value


def _in_daemon_thread(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], finished: threading.Event
) -> asyncio.Future[Any]:
    """A future of ``fn``'s answer, computed in a new daemon thread (with the caller's
    context variables, as ``asyncio.to_thread`` does)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # the call overran: nobody waits for its answer
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def work() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the caller, never left unhandled here
            error = exc
        finally:
            finished.set()
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the event loop closed meanwhile: nobody waits any more
            pass

    name = f"tether-tool-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def _dropped(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of an overrun call nobody awaits any more."""
    if not task.cancelled() and task.exception() is not None:
        log.info("an overrun tool call failed", extra={"action": "overrun"})
