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

from tether.errors import ModelError
from tether.models.base import (
    Message,
    ModelResponse,
    TextSink,
    ToolSpec,
    Usage,
    arguments_of,
    text_of,
)
from tether.models.sdk import IncompleteStream, SDKErrors, SDKModel, SDKOptions

Block = dict[str, Any]
# The stream's events as the SDK decodes them, each a JSON object (``StreamedMessage``).
_EVENTS = anthropic.AsyncStream[object]


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
            text = text_of(message.get("content"))
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
            "content": text_of(message.get("content")),
        }
        return "user", [result]
    blocks: list[Block] = []
    text = text_of(message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    if role == "assistant":
        blocks.extend(_tool_use_block(call) for call in message.get("tool_calls") or [])
        return "assistant", blocks
    if role == "user":
        return "user", blocks
    raise ModelError(f"cannot send a message with role {role!r} to Anthropic")


def _tool_use_block(call: dict[str, Any]) -> Block:
    arguments = arguments_of(call)  # Messages needs an object
    function = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


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


def _usage(reported: dict[str, Any]) -> Usage:
    """The usage a stream reported. Input tokens include cache reads and writes: the price
    table has no cache rates, so spend errs high and budgets still hold."""
    input_tokens = (
        int(reported.get("input_tokens") or 0)
        + int(reported.get("cache_creation_input_tokens") or 0)
        + int(reported.get("cache_read_input_tokens") or 0)
    )
    return Usage(input_tokens=input_tokens, output_tokens=int(reported.get("output_tokens") or 0))


class StreamedMessage:
    """A Messages stream put back together, event by event, as the message it streams:
    input usage from ``message_start``; text and ``tool_use`` blocks from their start,
    deltas and stop (a tool's input is the JSON of its ``input_json_delta`` pieces, read at
    its ``content_block_stop``); output usage from ``message_delta``; complete at
    ``message_stop``. Text pieces go to ``on_text`` as they come. Error events are raised
    by the SDK as it reads them.

    The events are the JSON objects the SDK's stream decodes (``AsyncStream[object]``), as
    the OpenAI adapter's chunks are, and for the same reason: no typed model per event."""

    def __init__(self, on_text: TextSink, model: str) -> None:
        self._on_text = on_text
        self._model = model
        self._started = False
        self._usage: dict[str, Any] = {}
        self._texts: dict[int, list[str]] = {}
        self._calls: dict[int, Block] = {}
        self._json: dict[int, list[str]] = {}
        self._stopped = False

    def add(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        index = int(event.get("index") or 0)
        if kind == "message_start":
            self._started = True
            self._usage = dict((event.get("message") or {}).get("usage") or {})
        elif kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "text":
                self._texts[index] = []
                self._text(index, block.get("text") or "")
            elif block.get("type") == "tool_use":
                self._calls[index] = block
                self._json[index] = []
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                self._text(index, delta.get("text") or "")
            elif delta.get("type") == "input_json_delta" and index in self._json:
                self._json[index].append(delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            self._read_input(index)
        elif kind == "message_delta":
            usage = event.get("usage") or {}
            self._usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self._stopped = True

    def _text(self, index: int, text: str) -> None:
        if index in self._texts and text:
            self._texts[index].append(text)
            self._on_text(text)

    def _read_input(self, index: int) -> None:
        raw = "".join(self._json.pop(index, []))
        if not raw:
            return
        try:
            self._calls[index]["input"] = json.loads(raw)
        except ValueError:
            raise ModelError(f"the model sent a tool input that is not JSON: {raw!r}") from None

    def response(self) -> ModelResponse:
        """The message streamed, once ``message_stop`` has come, as a plain OpenAI-format
        assistant message with its usage (``model``: the name that was requested)."""
        if not self._started or not self._stopped:
            raise IncompleteStream("the stream ended without message_stop")
        texts = ["".join(pieces) for _, pieces in sorted(self._texts.items())]
        message: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
        calls = [
            {
                "id": block.get("id"),
                "type": "function",
                "function": {
                    "name": block.get("name"),
                    "arguments": json.dumps(block.get("input")),
                },
            }
            for _, block in sorted(self._calls.items())
        ]
        if calls:
            message["tool_calls"] = calls
        return ModelResponse(message=message, usage=_usage(self._usage), model=self._model)


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
            cast_to=object,
            stream=True,
            stream_cls=_EVENTS,
        )
        assembled = StreamedMessage(on_text, self.model)
        async with stream:
            async for event in stream:
                assembled.add(event)
        return assembled.response()
