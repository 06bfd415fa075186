"""The ``anthropic:`` adapter: the Anthropic Messages API.

tether keeps history in OpenAI chat format; this module translates it to Messages at the
edge (system prompt apart, tool calls as ``tool_use`` blocks, tool results as
``tool_result`` blocks in a user turn) and the reply back. Every call streams: the events
are put back together as the message they stream (``StreamedMessage``), its text handed
on as it arrives. Retries and timeouts are the SDK's own (``max_retries``, ``timeout``;
the timeout also bounds the wait for each next event).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Unpack

import anthropic
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent

from tether.errors import ModelError
from tether.models.base import Message, ModelResponse, TextSink, ToolSpec, Usage
from tether.models.sdk import IncompleteStream, SDKErrors, SDKModel, SDKOptions

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


class StreamedMessage:
    """A Messages stream put back together, event by event, as the message it streams:
    id, model and input usage from ``message_start``; text and ``tool_use`` blocks from
    their start, deltas and stop (a tool's input is the JSON of its ``input_json_delta``
    pieces, read at its ``content_block_stop``); the stop reason and output usage from
    ``message_delta``; complete at ``message_stop``. Text pieces go to ``on_text`` as they
    come. Error events are raised by the SDK as it reads them."""

    def __init__(self, on_text: TextSink) -> None:
        self._on_text = on_text
        self._start: AnthropicMessage | None = None
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, Block] = {}
        self._json: dict[int, list[str]] = {}
        self._stop_reason: str | None = None
        self._stopped = False

    def add(self, event: RawMessageStreamEvent) -> None:
        if event.type == "message_start":
            self._start = event.message
            self._usage = event.message.usage.model_dump()
        elif event.type == "content_block_start":
            block = event.content_block
            if block.type == "text":
                self._blocks[event.index] = {"type": "text", "text": ""}
                self._text(event.index, block.text)
            elif block.type == "tool_use":
                self._blocks[event.index] = block.model_dump()
                self._json[event.index] = []
        elif event.type == "content_block_delta":
            if event.delta.type == "text_delta":
                self._text(event.index, event.delta.text)
            elif event.delta.type == "input_json_delta" and event.index in self._json:
                self._json[event.index].append(event.delta.partial_json)
        elif event.type == "content_block_stop":
            self._read_input(event.index)
        elif event.type == "message_delta":
            self._stop_reason = event.delta.stop_reason
            self._usage.update(event.usage.model_dump(exclude_none=True))
        elif event.type == "message_stop":
            self._stopped = True

    def _text(self, index: int, text: str) -> None:
        if index in self._blocks and text:
            self._blocks[index]["text"] += text
            self._on_text(text)

    def _read_input(self, index: int) -> None:
        raw = "".join(self._json.pop(index, []))
        if not raw:
            return
        try:
            self._blocks[index]["input"] = json.loads(raw)
        except ValueError:
            raise ModelError(f"the model sent a tool input that is not JSON: {raw!r}") from None

    def message(self) -> AnthropicMessage:
        """The message streamed, once ``message_stop`` has come."""
        if self._start is None or not self._stopped:
            raise IncompleteStream("the stream ended without message_stop")
        return AnthropicMessage.construct(
            **{
                **self._start.model_dump(),
                "content": [block for _, block in sorted(self._blocks.items())],
                "stop_reason": self._stop_reason,
                "usage": self._usage,
            }
        )


class AnthropicModel(SDKModel[anthropic.AsyncAnthropic]):
    """A Claude model reached through the Messages API."""

    provider = "anthropic"
    key_vars = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
    base_var = "ANTHROPIC_BASE_URL"
    errors = SDKErrors(
        base=anthropic.AnthropicError,
        api=anthropic.APIError,
        status=anthropic.APIStatusError,
        timeout=anthropic.APITimeoutError,
        connection=anthropic.APIConnectionError,
    )
    http_client_class = anthropic.DefaultAioHttpClient
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
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": turns,
            "stream": True,
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = to_anthropic_tools(tools)
        # The client's own ``post``, as the OpenAI adapter does and for the same reason:
        # the SDK's typed transform of ``messages.create`` walks the whole history and
        # changes nothing in it (its one format, base64, applies to file objects only).
        stream = await self._client.post(
            "/v1/messages",
            body=body,
            cast_to=AnthropicMessage,
            stream=True,
            stream_cls=anthropic.AsyncStream[RawMessageStreamEvent],
        )
        assembled = StreamedMessage(on_text)
        async with stream:
            async for event in stream:
                assembled.add(event)
        return from_anthropic_response(assembled.message(), self.model)
