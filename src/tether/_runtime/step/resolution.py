"""A tool call resolved: its tool and validated arguments (``Resolved``), an approver's edit
of them, or the refusal stored as its result when there is no such tool or they do not fit.
Shared by the first meeting of a call (``tool_call.py``), its suspension and its decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tether._runtime.step.writes import Result, error_content
from tether.messages import ToolCall
from tether.store import CallStatus
from tether.tools.tool import InvalidToolArguments, Tool

if TYPE_CHECKING:
    from tether._runtime.step.session import RunSession


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """A call whose tool exists and whose arguments validate; ``edited`` holds the
    arguments an approver edited the model's to (it runs with those, reference §9)."""

    call: ToolCall
    tool: Tool
    args: BaseModel
    edited: dict[str, Any] | None = None

    def shown(self, content: Any) -> Any:
        """The result the model sees: an edited call's says it ran with edited arguments."""
        if self.edited is None:
            return content
        return {"edited_by_user": {"arguments": self.edited}, "result": content}


def resolved(session: RunSession, call: ToolCall) -> Resolved | Result:
    """The call's tool and validated arguments, or, when there is no such tool or the
    arguments do not fit, the refusal to store as its result (nothing is written)."""
    tool = session.services.agent.tool(call.name)
    if tool is None:
        return refusal(call, "unknown_tool", f"there is no tool {call.name!r}")
    try:
        return Resolved(call=call, tool=tool, args=tool.validate(call.parsed_arguments()))
    except InvalidToolArguments as exc:
        return refusal(call, exc.code, exc.message)


def edited(r: Resolved, arguments: dict[str, Any]) -> Resolved | Result:
    """The call with an approver's edited ``arguments`` validated by the tool's schema,
    or the refusal to store when they no longer fit it (the tool changed since)."""
    try:
        args = r.tool.validate(arguments)
    except InvalidToolArguments as exc:
        return refusal(r.call, exc.code, exc.message)
    return Resolved(call=r.call, tool=r.tool, args=args, edited=args.model_dump(mode="json"))


def refusal(call: ToolCall, code: str, message: str) -> Result:
    """A call that did not run, with why: stored as its result, not counted."""
    return Result(
        call=call, content=error_content(code, message), status=CallStatus.ERROR, counted=False
    )
