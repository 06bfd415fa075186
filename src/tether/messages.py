"""Helpers over the stored message list (OpenAI chat format). The messages are the state
(invariant 1): which tool calls of the last turn still await a result is read from them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tether.models.base import Message


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """A tool call as the model asked for it; ``arguments`` is the raw JSON string."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """The arguments decoded, or the raw string if it is not JSON (validation says so)."""
        try:
            return json.loads(self.arguments) if self.arguments else {}
        except ValueError:
            return self.arguments


def tool_calls_of(message: Message) -> list[ToolCall]:
    """The tool calls of an assistant message, in the order the model gave them."""
    calls = []
    for raw in message.get("tool_calls") or []:
        function = raw.get("function") or {}
        calls.append(
            ToolCall(
                id=str(raw.get("id")),
                name=str(function.get("name")),
                arguments=str(function.get("arguments") or ""),
            )
        )
    return calls


def pending_tool_calls(messages: list[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant turn that have no tool result yet, in order.

    After a suspension, a budget halt or a crash mid-turn these are what the loop must
    process before it asks the model again (reference §1).
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant":
            answered = {
                m.get("tool_call_id") for m in messages[index + 1 :] if m.get("role") == "tool"
            }
            return [call for call in tool_calls_of(message) if call.id not in answered]
    return []


def tool_result(call_id: str, content: Any) -> Message:
    """A tool result message; non-string content is stored as canonical JSON."""
    text = content if isinstance(content, str) else canonical_json(content)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def canonical_json(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, UTF-8; the input of every digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
