"""A deterministic model that replays a script: used by tests, benchmarks and the demo.

The turn it plays is the number of assistant messages already in the history, so a run
resumed in another process gets the same next turn (the model keeps no hidden state).
Script file: ``{"model": "scripted", "turns": [{"content": "...", "tool_calls":
[{"id"?, "name", "arguments": {...} | "raw string"}], "usage": {"input_tokens",
"output_tokens"}}, ...]}``. Past the last turn it answers with a fixed final message.

An argument value ``"${TOOL.FIELD}"`` is replaced by FIELD of the latest result of a call
to TOOL in the history (e.g. ``{"quote_id": "${draft_quote.quote_id}"}``), so a script can
use what an earlier tool returned, as a real model would.

A tree of sub-agents (reference §18) plays one script per agent: ``"by_system": {"TEXT":
{"turns": [...], "final"?}}`` plays those turns for the runs whose system message starts
with TEXT (a sub-agent's prompt), and ``turns`` for the others.

A script may also say how its text streams (reference §16): ``"stream": {"chunk_chars":
8, "delay_s": 0.05}`` hands each turn's text to a streaming caller in pieces of that many
code points, one every ``delay_s`` (by default the whole text at once, with no delay).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tether.errors import ConfigError
from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec, Usage

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


class StreamPace(BaseModel):
    """How a scripted turn's text is handed to a streaming caller."""

    model_config = ConfigDict(extra="forbid")

    chunk_chars: int | None = Field(default=None, ge=1)  # None: the whole text at once
    delay_s: float = Field(default=0.0, ge=0.0, le=60.0)  # before each piece


class AgentScript(BaseModel):
    """The turns of the runs whose system message starts with a given text (a sub-agent's,
    reference §18), played as the script's own are."""

    model_config = ConfigDict(extra="forbid")

    turns: list[ScriptedTurn]
    final: str = "I have nothing more to do."


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "scripted"
    turns: list[ScriptedTurn]
    final: str = "I have nothing more to do."
    stream: StreamPace = Field(default_factory=StreamPace)
    # System message prefix → the script of those runs (a tree of sub-agents); a run whose
    # system message starts with none of them plays ``turns``.
    by_system: dict[str, AgentScript] = Field(default_factory=dict)

    def of(self, messages: list[Message]) -> tuple[list[ScriptedTurn], str]:
        """The turns and final answer of the run whose ``messages`` these are."""
        system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
        if isinstance(system, str):
            for prefix, script in self.by_system.items():
                if system.startswith(prefix):
                    return script.turns, script.final
        return self.turns, self.final


class ScriptedModel(Model):
    """Replays ``turns`` in order, one per assistant message already in the history."""

    def __init__(
        self,
        turns: Sequence[ScriptedTurn | dict[str, Any]],
        *,
        model: str = "scripted",
        final: str = "I have nothing more to do.",
        stream: StreamPace | dict[str, Any] | None = None,
        by_system: dict[str, Any] | None = None,
    ) -> None:
        try:
            self.script = Script.model_validate(
                {
                    "model": model,
                    "turns": list(turns),
                    "final": final,
                    "stream": stream or {},
                    "by_system": by_system or {},
                }
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
        return cls(
            script.turns,
            model=script.model,
            final=script.final,
            stream=script.stream,
            by_system=script.by_system,
        )

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        index = sum(1 for m in messages if m.get("role") == "assistant")
        turns, final = self.script.of(messages)
        if index >= len(turns):
            turn = ScriptedTurn(content=final, usage={"input_tokens": 10})
        else:
            turn = turns[index]
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

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """The turn ``request`` gives, its text handed over at the script's pace."""
        response = await self.request(messages, tools)
        text = response.message.get("content")
        if not isinstance(text, str) or not text:
            return response
        pace = self.script.stream
        size = pace.chunk_chars or len(text)
        for start in range(0, len(text), size):
            if pace.delay_s:
                await asyncio.sleep(pace.delay_s)
            on_text(text[start : start + size])
        return response


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
