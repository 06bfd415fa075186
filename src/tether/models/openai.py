"""The ``openai:`` adapter: OpenAI Chat Completions, or any server that speaks it.

tether's messages are already in Chat Completions format, so requests pass through as they
are; only the response is reduced to a plain dict the engine can store verbatim. Retries
and timeouts are the SDK's own (``max_retries``, ``timeout``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallUnion,
    ChatCompletionToolUnionParam,
)

from tether.errors import ModelError
from tether.models.base import Message, ModelResponse, TextSink, ToolSpec, Usage
from tether.models.sdk import SDKErrors, SDKModel


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


class OpenAIChatModel(SDKModel[openai.AsyncOpenAI]):
    """A model reached through the Chat Completions API (OpenAI or a compatible server)."""

    provider = "openai"
    key_vars = ("OPENAI_API_KEY",)
    base_var = "OPENAI_BASE_URL"
    errors = SDKErrors(
        base=openai.OpenAIError,
        status=openai.APIStatusError,
        timeout=openai.APITimeoutError,
        connection=openai.APIConnectionError,
    )
    client_class = openai.AsyncOpenAI

    async def _call(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        completion = await self._client.chat.completions.create(
            model=self.model,
            messages=cast("list[ChatCompletionMessageParam]", messages),
            tools=(
                cast("list[ChatCompletionToolUnionParam]", to_openai_tools(tools))
                if tools
                else openai.omit
            ),
        )
        return from_openai_completion(completion, self.model)
