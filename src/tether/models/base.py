"""The one abstract model call every adapter implements.

Messages are stored and exchanged in OpenAI chat format (provider-neutral for us): a list
of ``{"role": "system"|"user"|"assistant"|"tool", ...}`` dicts, assistant tool calls as
``{"id", "type": "function", "function": {"name", "arguments": JSON-string}}`` and tool
results as ``{"role": "tool", "tool_call_id", "content"}``. Adapters translate at the edge.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.errors import ModelError

Message = dict[str, Any]

# Where a streaming call hands the assistant's text as it is written (reference §16): each
# piece follows the one before it, and together they are the turn's ``content``.
TextSink = Callable[[str], None]


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, None, or a list of ``text`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content)


def arguments_of(call: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a stored tool call (``function.arguments``, a JSON string) as the
    object a provider that takes them decoded needs (Anthropic's ``input``, Gemini's
    ``args``); a history that holds anything else cannot be sent there: ``ModelError``."""
    raw = call["function"].get("arguments") or "{}"
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ModelError(
            f"tool call {call.get('id')!r} has arguments that are not a JSON object: {raw!r}"
        )
    return arguments


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token usage the provider reported for one call."""

    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool as the model sees it: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI Chat Completions ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    """One model turn: the assistant message (OpenAI format), its usage, and the model name
    used for pricing."""

    message: Message
    usage: Usage
    model: str


class Model(ABC):
    """A chat model with tool calling. One call, no hidden state: everything the model knows
    is in ``messages``, so a resumed run gets exactly what the model saw before."""

    name: str = "model"

    @abstractmethod
    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        """Ask for the next assistant turn given the whole history and the tools."""

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """The same call, handing the assistant text to ``on_text`` as it is written (the
        engine's call). A model that cannot stream hands it over in one piece once the
        reply is complete; the returned turn is always the whole of it."""
        response = await self.request(messages, tools)
        text = response.message.get("content")
        if isinstance(text, str) and text:
            on_text(text)
        return response

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most models hold nothing
        """Release clients the adapter holds."""
