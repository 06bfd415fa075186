"""A tool call bounded by its timeout (reference §10), and never waited on once it overran;
a tool's checks (guard, preview, ...) are bounded the same way, by ``check_timeout_s``.

An ``async def`` runs as a task, cancelled at the timeout (it stops at its next await). A
plain function runs in a daemon thread of its own, not in the event loop's executor: the
heartbeat and every ``to_thread`` share that executor, and a process joins its threads at
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
import queue
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
    if not inspect.iscoroutinefunction(fn):
        return await _plain_within(fn, args, kwargs, timeout_s=timeout_s, key=key)
    task = asyncio.ensure_future(fn(*args, **kwargs))
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
        _remember(key, lambda: not task.done())
    raise _overran(fn, timeout_s)


async def _plain_within(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    timeout_s: float,
    key: str | None,
) -> Any:
    """``within`` for a plain function: it runs in a daemon thread, awaited with the
    timeout (the thread is left behind at the timeout; ``finished`` says when it ends)."""
    finished = threading.Event()
    future = _in_daemon_thread(fn, args, kwargs, finished)
    try:
        value = await asyncio.wait_for(future, timeout_s)
    except TimeoutError:
        if key is not None:
            _remember(key, lambda: not finished.is_set())
        raise _overran(fn, timeout_s) from None
    if inspect.isawaitable(value):  # a plain function that returned an awaitable
        return await asyncio.wait_for(value, timeout_s)
    return value


def _overran(fn: Callable[..., Any], timeout_s: float) -> TimeoutError:
    name = getattr(fn, "__name__", "the tool")
    return TimeoutError(f"{name} did not answer within {timeout_s:g} s")


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

    def work() -> Callable[[], None]:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the caller, never left unhandled here
            error = exc
        finally:
            finished.set()

        def deliver() -> None:
            try:
                loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:  # the event loop closed meanwhile: nobody waits any more
                pass

        return deliver

    _THREADS.submit(work)
    return future


class _DaemonThreads:
    """Daemon threads that run plain-function calls, each reused once its call returned
    (it is counted idle before the answer is handed back, so the caller's next call finds
    it) and ended after ``IDLE_S`` without work. A call that never returns keeps its thread
    and nothing else: the next call gets an idle thread or a new one. (The standard
    library's pool joins its threads at exit, so one hung call would hang the process.)

    ``_idle`` counts the waiting threads no queued call has claimed yet; it is changed
    under the lock only, so every queued call has a thread waiting for it."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Callable[[], Callable[[], None]]] = queue.SimpleQueue()
        self._idle = 0

    def submit(self, job: Callable[[], Callable[[], None]]) -> None:
        """Run ``job`` on an idle thread or a new one; what it returns is called once the
        thread is idle again (it hands the answer back)."""
        with self._lock:
            claimed = self._idle > 0
            if claimed:
                self._idle -= 1
        self._work.put(job)
        if not claimed:
            threading.Thread(target=self._serve, name="tether-tool", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._work.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # unclaimed: this thread may go
                        self._idle -= 1
                        return
                continue  # claimed by a call being queued: wait for it
            deliver = job()
            with self._lock:
                self._idle += 1
            deliver()


_THREADS = _DaemonThreads()


def _dropped(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of an overrun call nobody awaits any more."""
    if not task.cancelled() and task.exception() is not None:
        log.info("an overrun tool call failed", extra={"action": "overrun"})
