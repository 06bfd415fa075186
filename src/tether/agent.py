"""An agent: its system prompt, its tools and its scope resolver, with a version."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tether.budget import Limits
from tether.compaction import Compaction
from tether.errors import ConfigError, TetherError
from tether.messages import canonical_json
from tether.models.base import Model, ToolSpec
from tether.output import check_output_type, instruction
from tether.scope import ScopeResolver, open_scope
from tether.tools.subagent import SubAgentTool, as_tool
from tether.tools.tool import Tool

if TYPE_CHECKING:
    from tether.config import Settings

MAX_VERSION_CHARS = 128


@dataclass(frozen=True, kw_only=True)
class Agent:
    """What a run is: the prompt, the tools the model may call, and how to resolve the
    user's scope. Runs record the versions they started with."""

    name: str
    system_prompt: str
    tools: tuple[Tool, ...] = ()
    resolve_scope: ScopeResolver = field(default=open_scope)
    # The declared agent version runs record (reference §12); None: ``NAME@`` and a digest of
    # the system message and the tools' names, schemas and effects (``agent_version``).
    version: str | None = None
    # The model to use when TETHER_MODEL is not set (the demo's scripted model).
    default_model: Callable[[], Model] | None = None
    # Handed to every tool call as ``ToolContext.deps`` (clients, base URLs, ...).
    deps: Any = None
    # Users with fixed API keys that ``migrate`` and ``serve`` make sure exist (the demo's
    # users); user id → key.
    users: Mapping[str, str] = field(default_factory=dict)
    # The highest priority those users may ask while an operator set them none (reference
    # §13; the demo's: 10); None: TETHER_MAX_PRIORITY.
    users_max_priority: int | None = None
    # What the agent needs running beside it while a process serves it (the demo starts
    # its sandbox when no URL is configured). Entered by ``serve``, ``worker`` and
    # ``demo``; yields the agent to serve (possibly with other ``deps``). One that takes a
    # keyword ``brief`` is told whether the process runs one command and exits (``running``).
    lifespan: Callable[..., AbstractAsyncContextManager[Agent]] | None = None
    # The pydantic model a final answer must validate against (reference §11, ``output.py``);
    # None: any final answer is the answer, and the system message is the prompt as given.
    output_type: type[BaseModel] | None = None
    # Long conversations reach the model as a summary and their last turns (reference §14);
    # None: the model always sees the whole conversation.
    compaction: Compaction | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ConfigError(f"agent {self.name}: duplicate tool names in {names}")
        check_output_type(self.output_type, self.name)
        if self.version is not None and not 0 < len(self.version) <= MAX_VERSION_CHARS:
            raise ConfigError(f"agent {self.name}: version must be 1 to 128 characters")
        if self.users_max_priority is not None and self.users_max_priority not in range(-10, 11):
            raise ConfigError(f"agent {self.name}: users_max_priority must be from -10 to 10")
        if self.compaction is not None and not isinstance(self.compaction, Compaction):
            raise ConfigError(
                f"agent {self.name}: compaction must be a tether.Compaction, "
                f"got {self.compaction!r}"
            )

    @cached_property
    def agent_version(self) -> str:
        """The version a run of this agent records and workers serve (reference §12): the
        declared ``version``, or ``NAME@`` and the first 12 hex characters of the SHA-256
        of the system message and each tool's name, argument schema and effect, so any
        change the model or the tools would notice is a new version."""
        if self.version is not None:
            return self.version
        shape: dict[str, Any] = {
            "system": self.instructions,
            "tools": [
                {"name": t.name, "parameters": s.parameters, "effect": t.effect.value}
                for t, s in zip(self.tools, self.tool_specs, strict=True)
            ],
        }
        if self.subagents:  # a sub-agent's change is a change of the whole tree (§18)
            shape["subagents"] = [t.agent.agent_version for t in self.subagents]
        digest = hashlib.sha256(canonical_json(shape).encode()).hexdigest()
        return f"{self.name}@{digest[:12]}"[:MAX_VERSION_CHARS]

    @cached_property
    def instructions(self) -> str:
        """The system message a run starts with: the prompt, and with an ``output_type``
        how to give the final answer and its JSON schema."""
        if self.output_type is None:
            return self.system_prompt
        return f"{self.system_prompt}\n\n{instruction(self.output_type)}"

    @cached_property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools as the model sees them, built once (a JSON schema is not free)."""
        return tuple(t.spec() for t in self.tools)

    @cached_property
    def subagents(self) -> tuple[SubAgentTool, ...]:
        """Its tools that hand a task to a sub-agent (reference §18), in declared order."""
        return tuple(t for t in self.tools if isinstance(t, SubAgentTool))

    @cached_property
    def tree(self) -> dict[str, Agent]:
        """Every agent of its tree by version, itself first, then its sub-agents level by
        level: a worker serving it serves them all (reference §18)."""
        found: dict[str, Agent] = {self.agent_version: self}
        for sub in self.subagents:
            for version, agent in sub.agent.tree.items():
                found.setdefault(version, agent)
        return found

    def agent_of(self, version: str) -> Agent:
        """The agent of its tree that runs of ``version`` are written for; itself for any
        other version (an older version it accepts is carried by its own code, §12)."""
        return self.tree.get(version, self)

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
    ) -> SubAgentTool:
        """This agent as a tool another agent lists (reference §18): the model calls it
        with ``{"task": STRING}`` and gets the child run's answer. ``name`` defaults to
        the agent's ``name``; ``limits`` (a ``Limits`` or a dict of the four) bounds each
        child of it apart from its tree. Checked now: ``invalid_tool`` names the problem."""
        return as_tool(
            self,
            name=name,
            description=description,
            limits=dict(limits) if isinstance(limits, Mapping) else limits,
        )

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        for candidate in self.tools:
            if candidate.name == name:
                return candidate
        return None

    def may_decide_call(self, tool: str, owner: str, approver: str) -> bool:
        """Whether the rule of the tool called ``tool`` (``@tool(approvers=...)``) lets
        ``approver`` decide its call in ``owner``'s run; the owner's scope is checked
        apart. A tool this agent lacks rules nothing (the decision halts the run
        ``tool_unavailable``)."""
        found = self.tool(tool)
        for agent in self.tree.values():  # a sub-agent's call is decided by its rule (§18)
            found = found or agent.tool(tool)
        return found is None or found.may_be_decided_by(approver, owner)

    @asynccontextmanager
    async def running(self, *, brief: bool = False) -> AsyncIterator[Agent]:
        """Enter the agent's ``lifespan`` (if any) and yield the agent to serve. It keeps
        this agent's version: a version is what was declared and deployed, so tools a
        lifespan adds (an MCP server's, listed at start-up) or its ``deps`` never change
        it, and every process of one deployment serves the same version whether or not it
        entered the lifespan. A lifespan tool that is gone is ``tool_unavailable``.

        ``brief``: the process runs one command and exits (a command a person runs, such
        as ``tether approve``). A lifespan that takes the keyword ``brief`` is given it, so
        it may use what a long-running process already runs instead of starting its own
        (the demo's uses the sandbox that a ``serve`` or ``worker`` on the same data
        serves); one that does not take it is entered as it always was."""
        if self.lifespan is None:
            yield self
            return
        told = {"brief": brief} if _takes_keyword(self.lifespan, "brief") else {}
        async with self.lifespan(self, **told) as agent:
            yield agent if agent is self else replace(agent, version=self.agent_version)

    def model_from(self, settings: Settings) -> Model | None:
        """The model ``TETHER_MODEL`` (``settings.model``) names, through the one parser
        ``tether.models.from_spec``; else this agent's ``default_model``; else None."""
        if settings.model:
            from tether.models import from_spec

            return from_spec(settings.model)
        return self.default_model() if self.default_model is not None else None

    def versions(self) -> dict[str, Any]:
        """The versions a run records when it starts."""
        return {
            "agent": self.agent_version,
            "tools": {t.name: t.version for t in self.tools},
        }


def load_agent(spec: str, settings: Settings | None = None) -> Agent:
    """Import ``MODULE:ATTR`` and return the Agent it names: an Agent, or a factory, which
    is given ``settings`` when it takes a parameter (so it needs no environment of its own)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--agent must be MODULE:ATTR, got {spec!r}")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except TetherError:
        raise
    except Exception as exc:  # a syntax error, a failing import: where, and the message
        raise ConfigError(f"cannot load agent {spec!r}: {_failure(exc)}") from exc
    agent = value
    if callable(value) and not isinstance(value, Agent):
        try:
            agent = value(settings) if _takes_one_argument(value, settings) else value()
        except TetherError:
            raise
        except Exception as exc:
            raise ConfigError(f"the agent factory {spec!r} failed: {_failure(exc)}") from exc
    if not isinstance(agent, Agent):
        raise ConfigError(f"{spec!r} is not a tether Agent")
    return agent


def _failure(exc: Exception) -> str:
    """An error met loading an agent, in one line: the exception's message and the file
    and line it points at (a syntax error's own, else the deepest frame of its traceback
    outside the import machinery), never the traceback and its frames' variables."""
    if isinstance(exc, SyntaxError):
        return f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    said = f"{type(exc).__name__}: {exc}"
    machinery = (__file__, importlib.__file__)
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen ") and frame.filename not in machinery
    ]
    return f"{said} ({frames[-1].filename}, line {frames[-1].lineno})" if frames else said


def _takes_keyword(function: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):  # no signature to inspect
        return False


def _takes_one_argument(factory: Callable[..., Any], argument: Any) -> bool:
    try:
        inspect.signature(factory).bind(argument)
    except (TypeError, ValueError):  # ValueError: no signature to inspect
        return False
    return True
