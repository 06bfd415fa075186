"""A deterministic model that replays a script: used by tests, benchmarks and the demo.

The turn it plays is the number of assistant messages already in the history, so a run
resumed in another process gets the same next turn (the model keeps no hidden state).
Script file: ``{"model": "scripted", "turns": [{"content": "...", "tool_calls":
[{"id"?, "name", "arguments": {...} | "raw string"}], "usage": {"input_tokens",
"output_tokens"}}, ...]}``. Past the last turn it answers with a fixed final message.

An argument value ``"${TOOL.FIELD}"`` is replaced by FIELD of the latest result of a call
to TOOL in the history (e.g. ``{"quote_id": "${draft_quote.quote_id}"}``), so a script can
use what an earlier tool returned, as a real model would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether.errors import ConfigError
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage

_REFERENCE = re.compile(r"^\$\{([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\}$")


class ScriptedCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ScriptedTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    usage: dict[str, int] = Field(
        default_factory=lambda: {"input_tokens": 1000, "output_tokens": 100}
    )


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "scripted"
    turns: list[ScriptedTurn]
    final: str = "I have nothing more to do."


class ScriptedModel(Model):
    """Replays ``turns`` in order, one per assistant message already in the history."""

    def __init__(
        self,
        turns: Sequence[ScriptedTurn | dict[str, Any]],
        *,
        model: str = "scripted",
        final: str = "I have nothing more to do.",
    ) -> None:
        try:
            self.script = Script.model_validate(
                {"model": model, "turns": list(turns), "final": final}
            )
        except ValidationError as exc:
            raise ConfigError(f"invalid script: {exc.errors(include_url=False)}") from exc
        self.name = f"scripted:{model}"

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load a JSON script; a missing or malformed file is a clear ``ConfigError``."""
        try:
            data = json.loads(Path(path).read_text())
            script = Script.model_validate(data)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read script {path}: {exc}") from exc
        return cls(script.turns, model=script.model, final=script.final)

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        index = sum(1 for m in messages if m.get("role") == "assistant")
        if index >= len(self.script.turns):
            turn = ScriptedTurn(content=self.script.final, usage={"input_tokens": 10})
        else:
            turn = self.script.turns[index]
        message: Message = {"role": "assistant", "content": turn.content}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{index}_{i}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.arguments
                        if isinstance(call.arguments, str)
                        else json.dumps(_resolve(call.arguments, messages)),
                    },
                }
                for i, call in enumerate(turn.tool_calls)
            ]
        usage = Usage(
            input_tokens=turn.usage.get("input_tokens", 0),
            output_tokens=turn.usage.get("output_tokens", 0),
        )
        return ModelResponse(message=message, usage=usage, model=self.script.model)


def _resolve(arguments: dict[str, Any], messages: list[Message]) -> dict[str, Any]:
    """Replace ``"${TOOL.FIELD}"`` values with FIELD of TOOL's latest result."""
    resolved: dict[str, Any] = {}
    for key, value in arguments.items():
        match = _REFERENCE.match(value) if isinstance(value, str) else None
        resolved[key] = _lookup(messages, match.group(1), match.group(2)) if match else value
    return resolved


def _lookup(messages: list[Message], tool: str, field: str) -> Any:
    names = {
        call.get("id"): (call.get("function") or {}).get("name")
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    }
    for message in reversed(messages):
        if message.get("role") == "tool" and names.get(message.get("tool_call_id")) == tool:
            try:
                return json.loads(message.get("content") or "").get(field)
            except (ValueError, AttributeError):
                return None
    return None
