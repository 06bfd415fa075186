"""The ``openai:`` adapter: OpenAI Chat Completions, or any server that speaks it.

tether's messages are already in Chat Completions format, so requests pass through as they
are; only the response is reduced to a plain dict the engine can store verbatim. Retries
and timeouts are the SDK's own (``max_retries``, ``timeout``).
"""

from __future__ import annotations

import logging
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
from tether.models.base import (
    Message,
    Model,
    ModelResponse,
    ToolSpec,
    Usage,
    model_error,
    sdk_credentials,
)

log = logging.getLogger(__name__)


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


def model_error_from(exc: openai.OpenAIError, name: str, timeout_s: float) -> ModelError:
    """A ``ModelError`` whose message names the HTTP status and the provider's message."""
    return model_error(
        exc,
        name,
        timeout_s,
        status_error=openai.APIStatusError,
        timeout_error=openai.APITimeoutError,
        connection_error=openai.APIConnectionError,
    )


class OpenAIChatModel(Model):
    """A model reached through the Chat Completions API (OpenAI or a compatible server)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.model = model
        self.name = f"openai:{model}"
        self.timeout_s = timeout_s
        self._owns_client = client is None
        self._client = client or self._make_client(base_url, api_key, timeout_s, max_retries)

    def _make_client(
        self, base_url: str | None, api_key: str | None, timeout_s: float, max_retries: int
    ) -> openai.AsyncOpenAI:
        api_key, resolved_base = sdk_credentials(
            self.name,
            api_key=api_key,
            base_url=base_url,
            key_vars=("OPENAI_API_KEY",),
            base_var="OPENAI_BASE_URL",
        )
        return openai.AsyncOpenAI(
            api_key=api_key,
            base_url=resolved_base,
            timeout=timeout_s,
            max_retries=max_retries,
        )

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        """One Chat Completions call; provider failures become ``ModelError``."""
        try:
            completion = await self._client.chat.completions.create(
                model=self.model,
                messages=cast("list[ChatCompletionMessageParam]", messages),
                tools=(
                    cast("list[ChatCompletionToolUnionParam]", to_openai_tools(tools))
                    if tools
                    else openai.omit
                ),
            )
        except openai.OpenAIError as exc:
            error = model_error_from(exc, self.name, self.timeout_s)
            log.warning(error.message, extra={"action": "model_error", "model": self.name})
            raise error from exc
        return from_openai_completion(completion, self.model)

    async def aclose(self) -> None:
        """Close the HTTP client this adapter created; an injected one is the caller's."""
        if self._owns_client:
            await self._client.close()
