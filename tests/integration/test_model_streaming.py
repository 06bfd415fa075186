"""The OpenAI and Anthropic adapters stream every call (reference §16), against loopback
servers that stream as each provider does (``tests/support/fakellm.py``).

The text reaches ``on_text`` in pieces that join into the turn's content, tool calls are
put back together from their pieces, usage comes from the end of the stream, and a stream
that breaks off is a ``ModelError`` classified as reference §10 says: an error sent mid-stream is
transient unless it says the request is invalid; a dropped connection, a stall past the
client's timeout and a stream that ends before its final event are transient.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from fakellm import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    Break,
    FakeLLMServer,
    Reply,
    anthropic_message,
    openai_completion,
    running,
)

from tether.errors import ModelError
from tether.models.anthropic import AnthropicModel
from tether.models.base import Message, ToolSpec, Usage
from tether.models.openai import OpenAIChatModel
from tether.models.sdk import SDKModel

PROVIDERS = ["openai", "anthropic"]
# The error type each provider sends for a failure on its side, in the middle of a stream.
SERVER_ERROR = {"openai": "server_error", "anthropic": "overloaded_error"}
HI: list[Message] = [{"role": "user", "content": "hi"}]
LOOKUP = ToolSpec(
    name="lookup_order",
    description="Look up an order by its id.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)
TEXT = "Order A-1001 shipped on Monday and should arrive by Thursday."


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeLLMServer]]:
    with running(OPENAI_PATH) as openai, running(ANTHROPIC_PATH) as anthropic:
        yield {"openai": openai, "anthropic": anthropic}


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def server(servers: dict[str, FakeLLMServer], provider: str) -> FakeLLMServer:
    servers[provider].reset()
    return servers[provider]


def model_for(provider: str, server: FakeLLMServer, **options: Any) -> SDKModel[Any]:
    if provider == "openai":
        return OpenAIChatModel(
            "gpt-4o-mini", base_url=f"{server.url}/v1", api_key="sk-test", **options
        )
    return AnthropicModel("claude-haiku-4-5", base_url=server.url, api_key="sk-ant-test", **options)


@pytest.fixture
async def model(provider: str, server: FakeLLMServer) -> AsyncIterator[SDKModel[Any]]:
    adapter = model_for(provider, server, max_retries=0)
    yield adapter
    await adapter.aclose()


def body(
    provider: str,
    text: str | None,
    calls: Sequence[tuple[str, dict[str, Any]]] = (),
    *,
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> dict[str, Any]:
    """A reply body with ``text`` and ``lookup_order`` calls ``(id, arguments)``."""
    if provider == "openai":
        tool_calls = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup_order", "arguments": json.dumps(arguments)},
            }
            for call_id, arguments in calls
        ]
        return openai_completion(
            content=text,
            tool_calls=tool_calls or None,
            prompt_tokens=input_tokens,
            completion_tokens=output_tokens,
        )
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text is not None else []
    blocks += [
        {"type": "tool_use", "id": call_id, "name": "lookup_order", "input": arguments}
        for call_id, arguments in calls
    ]
    return anthropic_message(blocks, input_tokens=input_tokens, output_tokens=output_tokens)


async def broken_off(
    model: SDKModel[Any], server: FakeLLMServer, breaks: Break, error_type: str = "api_error"
) -> tuple[ModelError, list[str]]:
    """The error of a call whose stream breaks off after its first text, and the text that
    reached ``on_text`` before it did."""
    server.script(Reply.broken(body(model.provider, TEXT), breaks, error_type))
    pieces: list[str] = []
    with pytest.raises(ModelError) as caught:
        await model.stream(HI, [], pieces.append)
    return caught.value, pieces


async def test_the_text_reaches_on_text_in_pieces_that_join_into_the_content(
    model: SDKModel[Any], server: FakeLLMServer, provider: str
) -> None:
    server.script(Reply(body=body(provider, TEXT, input_tokens=1000, output_tokens=500)))
    pieces: list[str] = []

    response = await model.stream(HI, [], pieces.append)

    assert len(pieces) > 1 and all(pieces)
    assert "".join(pieces) == TEXT
    assert response.message == {"role": "assistant", "content": TEXT}
    assert response.usage == Usage(input_tokens=1000, output_tokens=500)
    assert response.model == model.model
    sent = server.requests[0].body
    assert sent["stream"] is True
    if provider == "openai":
        assert sent["stream_options"] == {"include_usage": True}


async def test_two_tool_calls_of_one_turn_are_put_back_together_and_only_text_is_streamed(
    model: SDKModel[Any], server: FakeLLMServer, provider: str
) -> None:
    calls = [("call_1", {"order_id": "A-1001"}), ("call_2", {"order_id": "B-2002"})]
    server.script(Reply(body=body(provider, "Looking both up.", calls)))
    pieces: list[str] = []

    response = await model.stream(HI, [LOOKUP], pieces.append)

    assert response.message == {
        "role": "assistant",
        "content": "Looking both up.",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup_order", "arguments": json.dumps(arguments)},
            }
            for call_id, arguments in calls
        ],
    }
    assert "".join(pieces) == "Looking both up."


async def test_a_turn_of_tool_calls_alone_has_no_content_and_streams_no_text(
    model: SDKModel[Any], server: FakeLLMServer, provider: str
) -> None:
    server.script(Reply(body=body(provider, None, [("call_1", {"order_id": "A-1001"})])))
    pieces: list[str] = []

    response = await model.stream(HI, [LOOKUP], pieces.append)

    assert response.message["content"] is None
    assert [c["function"]["arguments"] for c in response.message["tool_calls"]] == [
        '{"order_id": "A-1001"}'
    ]
    assert pieces == []


async def test_openai_refusal_is_the_content_and_is_streamed_as_text(
    servers: dict[str, FakeLLMServer],
) -> None:
    server = servers["openai"]
    server.reset()
    refused = openai_completion(content=None)
    refused["choices"][0]["message"]["refusal"] = "I can't help with that."
    server.script(Reply(body=refused))
    model = model_for("openai", server, max_retries=0)
    pieces: list[str] = []
    try:
        response = await model.stream(HI, [], pieces.append)
    finally:
        await model.aclose()

    assert response.message == {"role": "assistant", "content": "I can't help with that."}
    assert "".join(pieces) == "I can't help with that."


async def test_a_server_error_in_the_middle_of_the_stream_is_transient(
    model: SDKModel[Any], server: FakeLLMServer, provider: str
) -> None:
    error, pieces = await broken_off(model, server, "error", SERVER_ERROR[provider])

    assert error.transient and error.status is None
    assert SERVER_ERROR[provider] in error.message
    assert pieces and TEXT.startswith("".join(pieces))
    assert len(server.requests) == 1


async def test_an_invalid_request_error_in_the_middle_of_the_stream_is_permanent(
    model: SDKModel[Any], server: FakeLLMServer
) -> None:
    error, _ = await broken_off(model, server, "error", "invalid_request_error")

    assert not error.transient
    assert "invalid_request_error" in error.message


async def test_a_connection_dropped_in_the_middle_of_the_stream_is_transient(
    model: SDKModel[Any], server: FakeLLMServer
) -> None:
    error, pieces = await broken_off(model, server, "drop")

    assert error.transient and error.status is None
    assert "broke off" in error.message
    assert pieces


async def test_a_stream_that_ends_before_its_final_event_is_transient(
    model: SDKModel[Any], server: FakeLLMServer
) -> None:
    error, pieces = await broken_off(model, server, "end")

    assert error.transient and error.status is None
    assert "ended its reply too soon" in error.message
    assert pieces


async def test_a_stream_that_stalls_past_the_timeout_is_a_transient_time_out(
    server: FakeLLMServer, provider: str
) -> None:
    model = model_for(provider, server, timeout_s=0.2, max_retries=0)
    try:
        error, pieces = await broken_off(model, server, "stall")
    finally:
        await model.aclose()

    assert error.transient and error.status is None
    assert "timed out after 0.2s" in error.message
    assert pieces
