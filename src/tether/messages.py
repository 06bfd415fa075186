"""Helpers over the stored message list (OpenAI chat format). The messages are the state
(invariant 1): which tool calls of the last turn still await a result is read from them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tether.errors import InvalidInput
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


def tool_call_ids(messages: Iterable[Message]) -> set[str]:
    """The ids of every tool call the assistant turns of ``messages`` made (as
    ``tool_calls_of`` names them, without building the calls)."""
    return {
        str(raw.get("id"))
        for m in messages
        if m.get("role") == "assistant"
        for raw in m.get("tool_calls") or ()
    }


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


def tool_results(messages: Sequence[Message]) -> dict[str, Any]:
    """The value of each tool result among ``messages``, by call id: what
    :func:`tool_result` stored, decoded (JSON back to its value; text as it is)."""
    found: dict[str, Any] = {}
    for message in messages:
        if message.get("role") != "tool" or "tool_call_id" not in message:
            continue
        content = message.get("content")
        try:
            found[message["tool_call_id"]] = (
                json.loads(content) if isinstance(content, str) else content
            )
        except ValueError:
            found[message["tool_call_id"]] = content
    return found


def canonical_json(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, UTF-8; the input of every digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def step_boundary(messages: Sequence[Message], at_step: object) -> int:
    """How many of ``messages`` are "through step ``at_step``" (the cut of a fork).

    ``at_step`` must be an int (not a bool) from 1 to the number of assistant messages,
    and every tool call of the ``at_step``-th assistant message must have its result
    (a ``tool`` message with its ``tool_call_id``) before the cut; else ``InvalidInput``.
    """
    if isinstance(at_step, bool) or not isinstance(at_step, int):
        raise InvalidInput("at_step must be an integer")
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not 1 <= at_step <= len(turns):
        raise InvalidInput(
            f"at_step must be between 1 and the run's step count ({len(turns)})",
            steps=len(turns),
        )
    cut = turns[at_step] if at_step < len(turns) else len(messages)
    turn = messages[turns[at_step - 1]]
    answered = {
        m.get("tool_call_id")
        for m in messages[turns[at_step - 1] + 1 : cut]
        if m.get("role") == "tool"
    }
    waiting = [c.get("id") for c in turn.get("tool_calls") or [] if c.get("id") not in answered]
    if waiting:
        raise InvalidInput(
            f"step {at_step} has tool calls without a result yet; fork at an earlier step",
            tool_call_ids=waiting,
        )
    return cut
