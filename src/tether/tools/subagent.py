"""A sub-agent as a tool (reference §18): ``Agent.as_tool`` declares it, and a call of it
starts a child run of that agent with the call's ``task`` as its question.

The call is a write declared ``concurrent``: the children of one turn run at once, beside
its reads (reference §15). It never runs a function of its own: the step that meets it
starts the child (``tether._runtime.step.children``), one per tool call, which is what
makes the call safe after a crash (a second start finds the first child).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from tether.budget import Limits, parse_limits
from tether.errors import InvalidInput
from tether.tools.declaration import InvalidTool
from tether.tools.tool import Effect, Tool

if TYPE_CHECKING:
    from tether.agent import Agent

# What the model may name a tool (the providers' rule: letters, digits, ``_`` and ``-``).
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_DESCRIPTION_CHARS = 1024
# The longest ``task`` a sub-agent call may hand its child (as long as a run's question).
MAX_TASK_CHARS = 20_000


class Task(BaseModel):
    """A sub-agent call's arguments: the task its child run is asked."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS, description="What to do")


def _never_called(*_: Any) -> None:  # pragma: no cover - the step starts a child instead
    raise RuntimeError("a sub-agent call starts a child run; it is never called")


@dataclass(frozen=True, kw_only=True)
class SubAgentTool(Tool):
    """A tool whose call starts a child run of ``agent``, bounded by ``child_limits``
    (declared; None: by its tree alone)."""

    agent: Agent
    child_limits: dict[str, Any] | None = None

    def limits_for(self, tree: Limits) -> Limits:
        """A child's limits: those it declares, and for the others the root's figures
        (``tree``), which never bind before the tree's own check does."""
        return parse_limits(self.child_limits, tree)


def as_tool(
    agent: Agent,
    *,
    name: str | None = None,
    description: str | None = None,
    limits: Limits | dict[str, Any] | None = None,
) -> SubAgentTool:
    """``agent`` as a tool of another agent; every argument is checked here, so a
    declaration that cannot work fails when it is written (``invalid_tool``)."""
    tool_name = agent.name if name is None else name
    if not isinstance(tool_name, str) or not _NAME.fullmatch(tool_name):
        raise InvalidTool(
            f"as_tool of agent {agent.name}: name must be 1 to 64 letters, digits, '_' or "
            f"'-', got {tool_name!r:.100}"
        )
    if description is not None and (
        not isinstance(description, str) or not 0 < len(description) <= MAX_DESCRIPTION_CHARS
    ):
        raise InvalidTool(
            f"as_tool of agent {agent.name}: description must be 1 to "
            f"{MAX_DESCRIPTION_CHARS} characters"
        )
    declared: dict[str, Any] | None = None
    if limits is not None:
        if not isinstance(limits, Limits | dict):
            raise InvalidTool(
                f"as_tool of agent {agent.name}: limits must be a tether.Limits or a dict of "
                f"max_steps, max_spend_usd, max_tool_calls, max_elapsed_ms; got {limits!r:.100}"
            )
        raw = limits.to_json() if isinstance(limits, Limits) else dict(limits)
        try:
            parse_limits(raw)
        except InvalidInput as exc:
            raise InvalidTool(f"as_tool of agent {agent.name}: {exc.message}") from exc
        declared = raw
    said = description or f"Hand a task to the {agent.name} agent and get its answer."
    return SubAgentTool(
        name=tool_name,
        description=said,
        args_model=Task,
        fn=_never_called,
        takes_context=False,
        effect=Effect.WRITE,
        dedupes=True,  # one child per call: a second start finds the first
        concurrent=True,
        version=agent.agent_version,
        agent=agent,
        child_limits=declared,
    )
