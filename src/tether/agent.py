"""An agent: its system prompt, its tools and its scope resolver, with a version."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tether.errors import ConfigError
from tether.models.base import Model, ToolSpec
from tether.scope import ScopeResolver, open_scope
from tether.tools import Tool


@dataclass(frozen=True, kw_only=True)
class Agent:
    """What a run is: the prompt, the tools the model may call, and how to resolve the
    user's scope. Runs record the versions they started with."""

    name: str
    system_prompt: str
    tools: tuple[Tool, ...] = ()
    resolve_scope: ScopeResolver = field(default=open_scope)
    version: str = "1"
    # The model to use when TETHER_MODEL is not set (the demo's scripted model).
    default_model: Callable[[], Model] | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ConfigError(f"agent {self.name}: duplicate tool names in {names}")

    @cached_property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools as the model sees them, built once (a JSON schema is not free)."""
        return tuple(t.spec() for t in self.tools)

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        for candidate in self.tools:
            if candidate.name == name:
                return candidate
        return None

    def versions(self) -> dict[str, Any]:
        """The versions a run records when it starts."""
        return {
            "agent": f"{self.name}@{self.version}",
            "tools": {t.name: t.version for t in self.tools},
        }


def load_agent(spec: str) -> Agent:
    """Import ``MODULE:ATTR`` and return the Agent it names (an Agent or a factory)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--agent must be MODULE:ATTR, got {spec!r}")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load agent {spec!r}: {exc}") from exc
    agent = value() if callable(value) and not isinstance(value, Agent) else value
    if not isinstance(agent, Agent):
        raise ConfigError(f"{spec!r} is not a tether Agent")
    return agent
