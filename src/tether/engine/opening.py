"""``opens``: the one way an engine's method opens the engine. It refuses input no backend
can store, then checks the schema first (once per engine, by its ``open()``); the
``Engine``, its web side and its operator side all use it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from tether import inputs

if TYPE_CHECKING:
    from tether._runtime.shared.services import Services
    from tether.engine.engine import Engine


class Opens(Protocol):
    async def open(self) -> None: ...


P = ParamSpec("P")
T = TypeVar("T")
E = TypeVar("E", bound=Opens)


def opens(
    method: Callable[Concatenate[E, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[E, P], Coroutine[Any, Any, T]]:
    """The method refuses a NUL character or a lone surrogate anywhere in its arguments
    (``invalid_input`` naming the argument, ``inputs.storable``) before anything else, so
    neither backend ever meets one, and checks the schema first (once per engine:
    ``Engine.open``)."""
    names = list(inspect.signature(method).parameters)[1:]  # after the engine

    async def opened(engine: E, /, *args: P.args, **kwargs: P.kwargs) -> T:
        for name, value in zip(names, args, strict=False):
            inputs.storable(value, name)
        for name, value in kwargs.items():
            inputs.storable(value, name)
        await engine.open()
        return await method(engine, *args, **kwargs)

    functools.update_wrapper(opened, method)
    return opened


class Side:
    """A side of an ``Engine`` (its web side, its operator's side): methods of its own on
    the engine's services, opened by the engine's ``open``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._services: Services = engine._services

    async def open(self) -> None:
        """The engine's ``open``: every method here that reads the store awaits it."""
        await self._engine.open()
