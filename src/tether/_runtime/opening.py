"""``opens``: an engine method that checks the schema first (once per engine, by its
``open()``), shared by the ``Engine`` and the method groups it is made of."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar


class Opens(Protocol):
    async def open(self) -> None: ...


P = ParamSpec("P")
T = TypeVar("T")
E = TypeVar("E", bound=Opens)


def opens(
    method: Callable[Concatenate[E, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[E, P], Coroutine[Any, Any, T]]:
    """The method checks the schema first (once per engine: ``Engine.open``)."""

    async def opened(engine: E, /, *args: P.args, **kwargs: P.kwargs) -> T:
        await engine.open()
        return await method(engine, *args, **kwargs)

    functools.update_wrapper(opened, method)
    return opened
