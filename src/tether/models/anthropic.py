"""The ``anthropic:`` adapter: the Anthropic Messages API.

tether keeps history in OpenAI chat format; this module translates it to Messages at the
edge (system prompt apart, tool calls as ``tool_use`` blocks, tool results as
``tool_result`` blocks in a user turn) and the reply back. Retries and timeouts are the
SDK's own (``max_retries``, ``timeout``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Unpack, cast

import anthropic
from anthropic.types import Message as AnthropicMessage
from anthropic.types import MessageParam, ToolParam

from tether.errors import ModelError
from tether.models.base import Message, ModelResponse, TextSink, ToolSpec, Usage
from tether.models.sdk import SDKErrors, SDKModel, SDKOptions

Block = dict[str, Any]


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """OpenAI-format history as ``(system, messages)`` for the Messages API.

    System messages are joined into ``system``; consecutive messages of one role (tool
    results included, which travel in a user turn) are merged, as the API requires
    alternating roles. Messages left with no content are dropped, as the API rejects them.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            text = _text_of(message.get("content"))
            if text:
                system.append(text)
            continue
        api_role, blocks = _blocks_of(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == api_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": api_role, "content": blocks})
    return "\n\n".join(system), turns


def _blocks_of(message: Message) -> tuple[str, list[Block]]:
    """The Messages role and content blocks of one non-system OpenAI-format message."""
    role = message.get("role")
    if role == "tool":
        result: Block = {
            "type": "tool_result",
            "tool_use_id": message["tool_call_id"],
            "content": _text_of(message.get("content")),
        }
        return "user", [result]
    blocks: list[Block] = []
    text = _text_of(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    if role == "assistant":
        blocks.extend(_tool_use_block(call) for call in message.get("tool_calls") or [])
        return "assistant", blocks
    if role == "user":
        return "user", blocks
    raise ModelError(f"cannot send a message with role {role!r} to Anthropic")


def _tool_use_block(call: dict[str, Any]) -> Block:
    function = call["function"]
    raw = function.get("arguments") or "{}"
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        # Messages needs an object; a history that holds anything else cannot be replayed.
        raise ModelError(
            f"tool call {call.get('id')!r} has arguments that are not a JSON object: {raw!r}"
        )
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


def _text_of(content: Any) -> str:
    """Text of an OpenAI ``content``: a string, None, or a list of ``text`` parts."""
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


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` entries for a Messages request."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            # The API requires an object schema even for a tool without arguments.
            "input_schema": tool.parameters or {"type": "object", "properties": {}},
        }
        for tool in tools
    ]


def from_anthropic_response(response: AnthropicMessage, model: str) -> ModelResponse:
    """A Messages reply as a plain OpenAI-format assistant message with its usage.

    Input tokens include cache reads and writes: the price table has no cache rates, so
    spend errs high and budgets still hold. ``model`` is the name that was requested.
    """
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in response.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            tool_calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": json.dumps(block.input)},
                }
            )
    message: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    usage = response.usage
    input_tokens = (
        usage.input_tokens
        + (usage.cache_creation_input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
    )
    return ModelResponse(
        message=message,
        usage=Usage(input_tokens=input_tokens, output_tokens=usage.output_tokens),
        model=model,
    )


class AnthropicModel(SDKModel[anthropic.AsyncAnthropic]):
    """A Claude model reached through the Messages API."""

    provider = "anthropic"
    key_vars = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
    base_var = "ANTHROPIC_BASE_URL"
    errors = SDKErrors(
        base=anthropic.AnthropicError,
        status=anthropic.APIStatusError,
        timeout=anthropic.APITimeoutError,
        connection=anthropic.APIConnectionError,
    )
    client_class = anthropic.AsyncAnthropic

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int = 4096,
        client: anthropic.AsyncAnthropic | None = None,
        **options: Unpack[SDKOptions],
    ) -> None:
        super().__init__(model, client=client, **options)
        self.max_tokens = max_tokens

    async def _call(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        system, turns = to_anthropic_messages(messages)
        response = await self._client.messages.create(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=cast("list[MessageParam]", turns),
            system=system or anthropic.omit,
            tools=cast("list[ToolParam]", to_anthropic_tools(tools)) if tools else anthropic.omit,
        )
        return from_anthropic_response(response, self.model)
