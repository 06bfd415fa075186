"""What a step is about to store: an assistant turn and a tool call's result, and the body
of a result that reports an error to the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.messages import ToolCall
from tether.models.base import Message
from tether.store import CallStatus


def error_content(code: str, message: str) -> dict[str, str]:
    """The body of a tool result that reports an error to the model."""
    return {"error": code, "message": message}


@dataclass(frozen=True, kw_only=True)
class Turn:
    """An assistant turn about to be stored: its message, calls, spend and trace data, and
    the input tokens its model call reported (the trigger of compaction, reference §14)."""

    message: Message
    calls: list[ToolCall]
    spend: float
    event: dict[str, Any]
    input_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Result:
    """A tool call's result about to be stored; ``counted`` when the tool ran."""

    call: ToolCall
    content: Any
    status: CallStatus
    counted: bool

    @property
    def summary(self) -> Any:
        """The error code of a result that is not ``ok``, for its trace event and span."""
        if isinstance(self.content, dict) and self.status is not CallStatus.OK:
            return self.content.get("error")
        return None

    def event(self) -> dict[str, Any]:
        """Its ``tool_result`` trace event's data (every result is traced)."""
        summary = self.summary
        return {
            "tool": self.call.name,
            "tool_call_id": self.call.id,
            "status": self.status.value,
            **({"error": summary} if summary else {}),
        }
