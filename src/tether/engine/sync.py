"""Blocking wrappers over ``Engine`` for scripts without an event loop: each call runs the
engine's coroutine in an event loop of its own, with the engine method's own signature."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from tether.engine.engine import Engine

P = ParamSpec("P")
T = TypeVar("T")


class _Blocking(Generic[P, T]):
    """A descriptor: ``SyncEngine().name(...)`` runs ``Engine.name(...)`` to completion."""

    def __init__(self, method: Callable[Concatenate[Engine, P], Coroutine[Any, Any, T]]) -> None:
        self._method = method

    @overload
    def __get__(self, owner: None, kind: type[SyncEngine]) -> _Blocking[P, T]: ...
    @overload
    def __get__(self, owner: SyncEngine, kind: type[SyncEngine]) -> Callable[P, T]: ...
    def __get__(
        self, owner: SyncEngine | None, kind: type[SyncEngine]
    ) -> _Blocking[P, T] | Callable[P, T]:
        if owner is None:
            return self
        engine, method = owner.engine, self._method

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return asyncio.run(method(engine, *args, **kwargs))

        return call


class SyncEngine:
    """The engine's main calls, blocking, with the same signatures as ``Engine``'s; an
    engine gives its own as ``Engine.sync``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    start_run = _Blocking(Engine.start_run)
    run_until_stop = _Blocking(Engine.run_until_stop)
    ask = _Blocking(Engine.ask)
    resume_after_confirmation = _Blocking(Engine.resume_after_confirmation)
    continue_run = _Blocking(Engine.continue_run)
    cancel_run = _Blocking(Engine.cancel_run)
    fork_run = _Blocking(Engine.fork_run)
    get_run = _Blocking(Engine.get_run)
    get_thread = _Blocking(Engine.get_thread)
    list_threads = _Blocking(Engine.list_threads)
    delete_thread = _Blocking(Engine.delete_thread)
    add_schedule = _Blocking(Engine.add_schedule)
    list_schedules = _Blocking(Engine.list_schedules)
    delete_schedule = _Blocking(Engine.delete_schedule)
    list_runs = _Blocking(Engine.list_runs)
    events = _Blocking(Engine.events)
    ledger = _Blocking(Engine.ledger)
    pending_approvals = _Blocking(Engine.pending_approvals)
    audit = _Blocking(Engine.audit)
    decide_calls = _Blocking(Engine.decide_calls)
