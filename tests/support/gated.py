"""``GatedModel``: a model that writes the first half of its turn, then waits for its gate
before it writes the second, so a test holds a step mid-stream (the model's text as it is
written, reference §16)."""

from __future__ import annotations

import asyncio

from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec, Usage

FIRST, SECOND = "first half, ", "second half"


class GatedModel(Model):
    """Writes ``FIRST``, waits for ``gate``, writes ``SECOND``: a step held mid-stream.
    ``written`` is set once a call wrote its first half; ``calls`` counts the calls."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written = asyncio.Event()
        self.calls = 0

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        raise AssertionError("the engine streams")

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        self.calls += 1
        on_text(FIRST)
        self.written.set()
        await self.gate.wait()
        on_text(SECOND)
        message = {"role": "assistant", "content": FIRST + SECOND}
        return ModelResponse(message=message, usage=Usage(), model="gated")
