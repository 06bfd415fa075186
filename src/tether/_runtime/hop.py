"""The one way from async code to the synchronous store: a thread hop per call, with
retries of transient database errors (``tether.store.backend.faults``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import ParamSpec, TypeVar

from tether.errors import DatabaseUnavailable
from tether.store.backend import faults
from tether.telemetry.content import db_error

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

# A store call that met a transient database error is retried after RETRY_FIRST_S,
# doubling up to RETRY_MAX_S (each pause jittered), until the store's ``retry_s``.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


async def hop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """One thread hop for one store call (the store is synchronous).

    A call that meets a transient database error and committed nothing is tried again
    with a backoff, for up to the store's ``retry_s``; so is an ``idempotent`` one (a step
    write) whose COMMIT was cut off, since it cannot apply twice. After that, or when the
    COMMIT of another call was cut off (it may have landed), ``DatabaseUnavailable`` is
    raised (see ``tether.store.backend.faults``). ``fn`` is a method of the store.
    """
    patience = float(getattr(getattr(fn, "__self__", None), "retry_s", 0.0))
    deadline: float | None = None
    delay = RETRY_FIRST_S
    while True:
        try:
            return await _in_thread(fn, *args, **kwargs)
        except faults.Transient as exc:
            now = time.monotonic()
            if deadline is None:
                deadline = now + patience
            if (exc.ambiguous and not faults.is_idempotent(fn)) or now + delay > deadline:
                raise _unavailable(fn, exc) from exc.__cause__
            log.warning(
                "database error; retrying",
                extra={"action": "db_retry", "call": _name(fn), "error": db_error(exc)},
            )
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, RETRY_MAX_S)


async def hop_once(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``hop`` without retries, for a caller that must answer now (readiness)."""
    try:
        return await _in_thread(fn, *args, **kwargs)
    except faults.Transient as exc:
        raise _unavailable(fn, exc) from exc.__cause__


async def _in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """One attempt of ``fn`` in a thread: the store's own executor (sized to its
    connection pool) when ``fn`` is a store method, else the loop's default one."""
    executor: Executor | None = getattr(getattr(fn, "__self__", None), "executor", None)
    call = functools.partial(faults.attempt, functools.partial(fn, *args, **kwargs))
    return await asyncio.get_running_loop().run_in_executor(executor, call)


def _name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _unavailable(fn: Callable[..., object], exc: faults.Transient) -> DatabaseUnavailable:
    what = "its outcome is unknown" if exc.ambiguous else "nothing was changed"
    log.error(
        "database unavailable",
        extra={"action": "db_unavailable", "call": _name(fn), "error": db_error(exc)},
    )
    return DatabaseUnavailable(f"the database is unavailable ({what}); try again shortly")
