"""What every run session shares within one engine: store, agent, model, settings and
where notices go; and the one way to reach the synchronous store from async code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from tether.agent import Agent
from tether.config import Settings
from tether.models.base import Model
from tether.notify import Notifier
from tether.store import Store

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Services:
    """The engine's parts a session, a call and a resumption need."""

    store: Store
    agent: Agent
    model: Model
    settings: Settings
    notifier: Notifier
    approve_url: Callable[[str], str] = field(default=lambda token: f"/approve/{token}")


async def hop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """One thread hop for one store transaction (the store is synchronous)."""
    return await asyncio.to_thread(fn, *args, **kwargs)
