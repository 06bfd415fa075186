"""Engines in this process, on a test's database: for any agent and model, for the agents
of ``agents.py``, and for an agent without tools; and a spy on the store's methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import agents

from tether import Agent, Engine, ScriptedModel
from tether.config import Settings
from tether.models.base import Model
from tether.notify import MemoryNotifier, Notifier


def engine_for(
    url: str,
    agent: Agent,
    model: Model | list[dict[str, Any]],
    *,
    notifier: Notifier | None = None,
    **settings: Any,
) -> Engine:
    """An in-process engine on ``url`` for ``agent`` on ``model`` (a list of turns: the
    scripted model playing them), with ``settings``; its notices go to ``notifier``, else
    to a ``MemoryNotifier``."""
    scripted = ScriptedModel(model) if isinstance(model, list) else model
    return Engine(
        agent=agent,
        model=scripted,
        settings=Settings(database_url=url, **settings),
        notifier=notifier if notifier is not None else MemoryNotifier(),
    )


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
    return engine_for(url, agents.agent(), model, notifier=notifier, **settings)


def fault_engine(url: str, *, notifier: Notifier | None = None, **settings: Any) -> Engine:
    """An in-process engine on ``url`` for ``agents.fault_agent``."""
    return engine_for(url, agents.fault_agent(), agents.ByQuestion(), notifier=notifier, **settings)


def tiny_engine(url: str, **settings: Any) -> Engine:
    """An engine for an agent without tools whose model answers at once."""
    agent = Agent(name="tiny", system_prompt="Answer.")
    return engine_for(url, agent, [{"content": "ok"}], **settings)


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
