"""Engines in this process, on a test's database, for the agents of ``agents.py``; and a
spy on the store's methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import agents

from tether import Engine, ScriptedModel
from tether.config import Settings
from tether.models.base import Model
from tether.notify import MemoryNotifier, Notifier


def engine(
    url: str,
    *,
    script_name: str = "standard",
    turns: list[dict[str, Any]] | None = None,
    notifier: Notifier | None = None,
    model: Model | None = None,
    **settings: Any,
) -> Engine:
    """An in-process engine on ``url`` for the test agent (on ``model``, else the scripted
    model of ``turns`` or of ``script_name``). Unless told otherwise, a
    notice's delivery window is the heartbeat timeout (a lost one is re-issued as soon
    as the suspension is stale)."""
    if "heartbeat_timeout_s" in settings:
        settings.setdefault("notice_timeout_s", settings["heartbeat_timeout_s"])
    if model is None:
        model = ScriptedModel(turns) if turns is not None else agents.script(script_name)
    return Engine(
        agent=agents.agent(),
        model=model,
        settings=Settings(database_url=url, **settings),
        notifier=notifier or MemoryNotifier(),
    )


def fault_engine(url: str, *, notifier: Notifier | None = None, **settings: Any) -> Engine:
    """An in-process engine on ``url`` for ``agents.fault_agent``."""
    return Engine(
        agent=agents.fault_agent(),
        model=agents.ByQuestion(),
        settings=Settings(database_url=url, **settings),
        notifier=notifier or MemoryNotifier(),
    )


def count_calls(engine: Engine, name: str) -> list[dict[str, Any]]:
    """Record the keyword arguments of each call of the store's method ``name`` (the
    calls still go through)."""
    seen: list[dict[str, Any]] = []
    method: Callable[..., Any] = getattr(engine.runner.store, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return method(*args, **kwargs)

    setattr(engine.runner.store, name, counted)
    return seen


def watchers(engine: Engine) -> list[Any]:
    """The live event streams ``engine`` is feeding now (its watchers, white-box)."""
    feed = engine.runner.services.feed
    assert feed is not None
    return list(feed._watchers)
