"""The ``openai:`` adapter: OpenAI Chat Completions, or any server that speaks it.

tether's messages are already in Chat Completions format, so requests pass through as they
are. Every call streams: the chunks are put back together as the completion they stream
(``ChatStream``), its text handed on as it arrives, and the completion is reduced to a
plain dict the engine can store verbatim. Retries and timeouts are the SDK's own
(``max_retries``, ``timeout``; the timeout also bounds the wait for each next chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import openai

from tether.errors import ModelError
from tether.models.base import Message, ModelResponse, TextSink, ToolSpec, Usage
from tether.models.sdk import IncompleteStream, SDKErrors, SDKModel

# The stream's chunks as the SDK decodes them, each a JSON object (``ChatStream``).
_CHUNKS = openai.AsyncStream[object]


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` entries for a Chat Completions request."""
    return [tool.to_openai() for tool in tools]


def _usage(reported: Any) -> Usage:
    """The usage a stream's last chunk reports (absent: none reported)."""
    if not isinstance(reported, dict):
        return Usage()
    return Usage(
        input_tokens=int(reported.get("prompt_tokens") or 0),
        output_tokens=int(reported.get("completion_tokens") or 0),
    )


class ChatStream:
    """A Chat Completions stream put back together, chunk by chunk, as the assistant
    message it streams: the first choice's text and refusal from their pieces, each tool
    call from the pieces of its ``index`` (id, name and type where they first appear,
    arguments joined), the usage from the chunk that carries it. Text pieces go to
    ``on_text`` as they come.

    The chunks are the JSON objects the SDK's stream decodes (``AsyncStream[object]``):
    building its typed chunk for each of them costs a worker much CPU for nothing (the
    capacity benchmark, benchmarks/README.md), the message being a plain dict in the end
    anyway."""

    def __init__(self, on_text: TextSink, model: str) -> None:
        self._on_text = on_text
        self._model = model
        self._content: list[str] | None = None
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish_reason: str | None = None
        self._usage: Any = None

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content is not None:
                if self._content is None:
                    self._content = []
                self._content.append(content)
                if content:
                    self._on_text(content)
            if delta.get("refusal"):
                self._refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                self._add_call(call)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]

    def _add_call(self, piece: dict[str, Any]) -> None:
        call = self._calls.setdefault(
            int(piece.get("index") or 0), {"id": None, "type": None, "name": None, "arguments": []}
        )
        call["id"] = call["id"] or piece.get("id")
        call["type"] = call["type"] or piece.get("type")
        function = piece.get("function")
        if function:
            call["name"] = call["name"] or function.get("name")
            call["arguments"].append(function.get("arguments") or "")

    def response(self) -> ModelResponse:
        """The assistant message streamed, once its first choice has finished, as a plain
        OpenAI-format message with its usage. A refusal stands for the text when there is
        none (the model's answer all the same), handed on now in one piece."""
        if self._finish_reason is None:
            raise IncompleteStream("the stream ended without a finish_reason")
        content = None if self._content is None else "".join(self._content)
        refusal = "".join(self._refusal) or None
        if content is None and refusal:
            self._on_text(refusal)
            content = refusal
        message: Message = {"role": "assistant", "content": content}
        calls = [self._call(call) for _, call in sorted(self._calls.items())]
        if calls:
            message["tool_calls"] = calls
        # ``model`` is the name that was requested, so price lookups do not depend on the
        # dated name a provider echoes back.
        return ModelResponse(message=message, usage=_usage(self._usage), model=self._model)

    def _call(self, call: dict[str, Any]) -> dict[str, Any]:
        kind = call["type"] or "function"
        if kind != "function":
            # tether only declares function tools; anything else is a provider surprise.
            raise ModelError(
                f"openai:{self._model} returned an unsupported tool call type {kind!r}"
            )
        return {
            "id": call["id"] or "",
            "type": "function",
            "function": {"name": call["name"] or "", "arguments": "".join(call["arguments"])},
        }


class OpenAIChatModel(SDKModel[openai.AsyncOpenAI]):
    """A model reached through the Chat Completions API (OpenAI or a compatible server)."""

    provider = "openai"
    key_vars = ("OPENAI_API_KEY",)
    base_var = "OPENAI_BASE_URL"
    errors = SDKErrors(
        base=openai.OpenAIError,
        api=openai.APIError,
        status=openai.APIStatusError,
        timeout=openai.APITimeoutError,
        connection=openai.APIConnectionError,
    )
    http_client_class = openai.DefaultAioHttpClient
    client_class = openai.AsyncOpenAI

    async def _call(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = to_openai_tools(tools)
        # The client's own ``post`` (its retries, timeout, errors and stream): the body is
        # already in the wire format, and ``chat.completions.create`` would first walk the
        # whole history through the SDK's typed transform, which changes nothing in it and
        # costs ever more CPU as a run grows (the capacity benchmark, benchmarks/README.md).
        stream = await self._client.post(
            "/chat/completions",
            body=body,
            cast_to=object,
            stream=True,
            stream_cls=_CHUNKS,
        )
        assembled = ChatStream(on_text, self.model)
        async with stream:
            async for chunk in stream:
                assembled.add(chunk)
        return assembled.response()
