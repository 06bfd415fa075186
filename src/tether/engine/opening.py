"""``opens``: the one way an engine's method opens the engine. It refuses input no backend
can store, then checks the schema first (once per engine, by its ``open()``); the
``Engine``, its web side and its operator side all use it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from tether import inputs


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
