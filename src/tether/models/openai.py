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
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageToolCallUnion,
)
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from tether.errors import ModelError
from tether.models.base import Message, ModelResponse, TextSink, ToolSpec, Usage
from tether.models.sdk import IncompleteStream, SDKErrors, SDKModel


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` entries for a Chat Completions request."""
    return [tool.to_openai() for tool in tools]


def from_openai_completion(completion: ChatCompletion, model: str) -> ModelResponse:
    """The first choice of ``completion`` as a plain OpenAI-format assistant message.

    ``model`` is the name that was requested, so price lookups do not depend on the dated
    name a provider echoes back.
    """
    if not completion.choices:
        raise ModelError(f"openai:{model} returned no choices")
    reply = completion.choices[0].message
    content = reply.content
    if content is None and reply.refusal:
        # A refusal is the model's answer; surface it as text rather than an empty turn.
        content = reply.refusal
    message: Message = {"role": "assistant", "content": content}
    tool_calls = [_tool_call_dict(call, model) for call in reply.tool_calls or []]
    if tool_calls:
        message["tool_calls"] = tool_calls
    usage = completion.usage
    return ModelResponse(
        message=message,
        usage=Usage(
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
        ),
        model=model,
    )


def _tool_call_dict(call: ChatCompletionMessageToolCallUnion, model: str) -> dict[str, Any]:
    if call.type != "function":
        # tether only declares function tools; anything else is a provider surprise.
        raise ModelError(f"openai:{model} returned an unsupported tool call type {call.type!r}")
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }


class ChatStream:
    """A Chat Completions stream put back together, chunk by chunk, as the completion it
    streams: the first choice's text and refusal from their pieces, each tool call from the
    pieces of its ``index`` (id, name and type where they first appear, arguments joined),
    the usage from the chunk that carries it. Text pieces go to ``on_text`` as they come."""

    def __init__(self, on_text: TextSink) -> None:
        self._on_text = on_text
        self._head: dict[str, Any] = {}
        self._content: list[str] | None = None
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish_reason: str | None = None
        self._usage: CompletionUsage | None = None

    def add(self, chunk: ChatCompletionChunk) -> None:
        self._head = {"id": chunk.id, "created": chunk.created, "model": chunk.model}
        if chunk.usage is not None:
            self._usage = chunk.usage
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content is not None:
                if self._content is None:
                    self._content = []
                self._content.append(delta.content)
                if delta.content:
                    self._on_text(delta.content)
            if delta.refusal:
                self._refusal.append(delta.refusal)
            for call in delta.tool_calls or []:
                self._add_call(call)
            if choice.finish_reason is not None:
                self._finish_reason = choice.finish_reason

    def _add_call(self, piece: ChoiceDeltaToolCall) -> None:
        call = self._calls.setdefault(
            piece.index, {"id": None, "type": None, "name": None, "arguments": []}
        )
        call["id"] = call["id"] or piece.id
        call["type"] = call["type"] or piece.type
        if piece.function is not None:
            call["name"] = call["name"] or piece.function.name
            call["arguments"].append(piece.function.arguments or "")

    def completion(self) -> ChatCompletion:
        """The completion streamed, once its first choice has finished. A refusal that
        stands for the text (``from_openai_completion``) is handed on now, in one piece."""
        if self._finish_reason is None:
            raise IncompleteStream("the stream ended without a finish_reason")
        content = None if self._content is None else "".join(self._content)
        refusal = "".join(self._refusal) or None
        if content is None and refusal:
            self._on_text(refusal)
        calls = [
            {
                "id": call["id"] or "",
                "type": call["type"] or "function",
                "function": {"name": call["name"] or "", "arguments": "".join(call["arguments"])},
            }
            for _, call in sorted(self._calls.items())
        ]
        message = {"role": "assistant", "content": content, "refusal": refusal}
        choice = {"index": 0, "finish_reason": self._finish_reason, "logprobs": None}
        return ChatCompletion.construct(
            **self._head,
            object="chat.completion",
            choices=[{**choice, "message": {**message, "tool_calls": calls or None}}],
            usage=self._usage,
        )


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
        # took 45% of a worker's CPU with 60-step runs (benchmarks/capacity.py).
        stream = await self._client.post(
            "/chat/completions",
            body=body,
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )
        assembled = ChatStream(on_text)
        async with stream:
            async for chunk in stream:
                assembled.add(chunk)
        return from_openai_completion(assembled.completion(), self.model)
