"""The OpenAI and Anthropic adapters against loopback servers that speak each API.

The official SDKs do the HTTP, so these tests prove what actually goes over the wire
(tool results, system prompt, tool schemas) and how provider failures surface, transient
or not. The servers are ``tests/support/fakellm.py``, and every call streams; the streams
themselves (their pieces, and streams that break off) are in ``test_model_streaming.py``;
what a run does when its model fails is in ``test_model_outage.py``; the translation to
Anthropic's messages, which needs no server, is tests/unit/test_anthropic_messages.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from fakellm import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    FakeLLMServer,
    Reply,
    anthropic_message,
    openai_completion,
)

from tether.errors import ConfigError, ModelError
from tether.models.anthropic import AnthropicModel
from tether.models.base import Message, ToolSpec, Usage
from tether.models.openai import OpenAIChatModel
from tether.models.pricing import spend_usd

# --- fixtures ---------------------------------------------------------------------------

LOOKUP = ToolSpec(
    name="lookup_order",
    description="Look up an order by its id.",
    parameters={
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "description": "e.g. A-1001"},
            "include_lines": {"type": "boolean"},
        },
        "required": ["order_id"],
        "additionalProperties": False,
    },
)
SYSTEM = "You are a careful support agent."


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a developer's real keys and endpoints out of these tests."""
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def openai_server_process() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer(OPENAI_PATH)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def anthropic_server_process() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer(ANTHROPIC_PATH)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def openai_server(openai_server_process: FakeLLMServer) -> FakeLLMServer:
    openai_server_process.reset()
    return openai_server_process


@pytest.fixture
def anthropic_server(anthropic_server_process: FakeLLMServer) -> FakeLLMServer:
    anthropic_server_process.reset()
    return anthropic_server_process


@pytest.fixture
async def gpt(openai_server: FakeLLMServer) -> AsyncIterator[OpenAIChatModel]:
    model = OpenAIChatModel(
        "gpt-4o-mini", base_url=f"{openai_server.url}/v1", api_key="sk-test", max_retries=0
    )
    yield model
    await model.aclose()


@pytest.fixture
async def claude(anthropic_server: FakeLLMServer) -> AsyncIterator[AnthropicModel]:
    model = AnthropicModel(
        "claude-haiku-4-5", base_url=anthropic_server.url, api_key="sk-ant-test", max_retries=0
    )
    yield model
    await model.aclose()


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- OpenAI -----------------------------------------------------------------------------


async def test_openai_tool_call_round_trip_sends_tool_result_and_returns_text(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1001"}'},
    }
    openai_server.script(
        Reply(body=openai_completion(tool_calls=[call])),
        Reply(body=openai_completion(content="Order A-1001 has shipped.")),
    )
    history: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is order A-1001?"},
    ]

    first = await gpt.request(history, [LOOKUP])
    assert first.message == {"role": "assistant", "content": None, "tool_calls": [call]}
    history.append(first.message)
    history.append({"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'})
    final = await gpt.request(history, [LOOKUP])

    assert final.message == {"role": "assistant", "content": "Order A-1001 has shipped."}
    assert json.loads(json.dumps(final.message)) == final.message
    sent = openai_server.requests[1].body
    assert sent["model"] == "gpt-4o-mini"
    assert sent["messages"][2]["tool_calls"] == [call]
    assert sent["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"status": "shipped"}',
    }


async def test_openai_sends_tool_schema_as_specified_and_omits_empty_tools(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer
) -> None:
    openai_server.script(
        Reply(body=openai_completion(content="a")), Reply(body=openai_completion(content="b"))
    )
    messages: list[Message] = [{"role": "user", "content": "hi"}]

    await gpt.request(messages, [LOOKUP])
    await gpt.request(messages, [])

    with_tools, without_tools = (r.body for r in openai_server.requests)
    assert with_tools["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Look up an order by its id.",
                "parameters": LOOKUP.parameters,
            },
        }
    ]
    assert "tools" not in without_tools


async def test_openai_usage_prices_under_the_requested_model_name(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer
) -> None:
    openai_server.script(
        Reply(body=openai_completion(content="ok", prompt_tokens=1000, completion_tokens=500))
    )

    resp = await gpt.request([{"role": "user", "content": "hi"}], [])

    assert resp.usage == Usage(input_tokens=1000, output_tokens=500)
    # The server echoes a dated name; pricing keys on the name that was asked for.
    assert resp.model == "gpt-4o-mini"
    assert spend_usd(resp.model, resp.usage) == pytest.approx((1000 * 0.15 + 500 * 0.60) / 1e6)


async def test_openai_missing_usage_counts_as_zero(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer
) -> None:
    body = openai_completion(content="ok")
    del body["usage"]
    openai_server.script(Reply(body=body))

    resp = await gpt.request([{"role": "user", "content": "hi"}], [])

    assert resp.usage == Usage(input_tokens=0, output_tokens=0)


async def test_openai_400_becomes_model_error_with_status_and_provider_message(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer
) -> None:
    error = {
        "error": {
            "message": "Invalid schema for function 'lookup_order'.",
            "type": "invalid_request_error",
            "param": "tools[0]",
            "code": "invalid_function_parameters",
        }
    }
    openai_server.script(Reply(status=400, body=error))

    with pytest.raises(ModelError) as caught:
        await gpt.request([{"role": "user", "content": "hi"}], [LOOKUP])

    assert "400" in caught.value.message
    assert "Invalid schema for function 'lookup_order'." in caught.value.message
    assert caught.value.code == "model_error"
    assert type(caught.value.__cause__).__name__ == "BadRequestError"


async def test_openai_500_without_retries_becomes_model_error_after_one_attempt(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer
) -> None:
    openai_server.script(Reply(status=500, body={"error": {"message": "upstream exploded"}}))

    with pytest.raises(ModelError, match=r"HTTP 500: upstream exploded"):
        await gpt.request([{"role": "user", "content": "hi"}], [])

    assert len(openai_server.requests) == 1


async def test_openai_sdk_retries_a_500_when_retries_are_allowed(
    openai_server: FakeLLMServer,
) -> None:
    openai_server.script(
        Reply(status=500, body={"error": {"message": "blip"}}, headers={"retry-after-ms": "1"}),
        Reply(body=openai_completion(content="recovered")),
    )
    model = OpenAIChatModel("gpt-4o-mini", base_url=f"{openai_server.url}/v1", max_retries=1)
    try:
        resp = await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()

    assert resp.message["content"] == "recovered"
    assert len(openai_server.requests) == 2


async def test_openai_timeout_becomes_model_error(openai_server: FakeLLMServer) -> None:
    release = threading.Event()
    openai_server.script(Reply(body=openai_completion(content="late"), hold=release))
    model = OpenAIChatModel(
        "gpt-4o-mini", base_url=f"{openai_server.url}/v1", timeout_s=0.2, max_retries=0
    )
    try:
        with pytest.raises(ModelError, match=r"timed out after 0\.2s") as caught:
            await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        release.set()
        await model.aclose()
    assert caught.value.transient and caught.value.status is None


async def test_openai_unreachable_server_becomes_model_error() -> None:
    model = OpenAIChatModel(
        "gpt-4o-mini", base_url=f"http://127.0.0.1:{unused_port()}/v1", max_retries=0
    )
    try:
        with pytest.raises(ModelError, match="could not be reached") as caught:
            await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()
    # The SDK's connection-level error (its aiohttp transport reports a refused connection
    # as the timeout subclass; the message says what happened).
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)
    assert caught.value.transient


async def test_openai_reads_base_url_and_key_from_the_environment(
    openai_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{openai_server.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    openai_server.script(Reply(body=openai_completion(content="ok")))
    model = OpenAIChatModel("gpt-4o-mini", max_retries=0)
    try:
        await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()

    assert model.name == "openai:gpt-4o-mini"
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_openai_local_server_needs_no_key(openai_server: FakeLLMServer) -> None:
    openai_server.script(Reply(body=openai_completion(content="ok")))
    model = OpenAIChatModel("llama3", base_url=f"{openai_server.url}/v1", max_retries=0)
    try:
        resp = await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()

    assert resp.message["content"] == "ok"
    assert openai_server.requests[0].headers["authorization"] == "Bearer not-set"


def test_openai_without_key_or_base_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")


# --- Anthropic --------------------------------------------------------------------------


async def test_anthropic_tool_call_round_trip_sends_tool_result_and_system(
    claude: AnthropicModel, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.script(
        Reply(
            body=anthropic_message(
                [
                    {"type": "text", "text": "Let me look that up."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "lookup_order",
                        "input": {"order_id": "A-1001"},
                    },
                ]
            )
        ),
        Reply(body=anthropic_message([{"type": "text", "text": "Order A-1001 has shipped."}])),
    )
    history: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is order A-1001?"},
    ]

    first = await claude.request(history, [LOOKUP])
    assert first.message == {
        "role": "assistant",
        "content": "Let me look that up.",
        "tool_calls": [
            {
                "id": "toolu_01",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1001"}'},
            }
        ],
    }
    history.append(first.message)
    history.append({"role": "tool", "tool_call_id": "toolu_01", "content": '{"status": "shipped"}'})
    final = await claude.request(history, [LOOKUP])

    assert final.message == {"role": "assistant", "content": "Order A-1001 has shipped."}
    sent = anthropic_server.requests[1].body
    assert sent["system"] == SYSTEM
    assert sent["model"] == "claude-haiku-4-5"
    assert sent["max_tokens"] == 4096
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where is order A-1001?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look that up."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "lookup_order",
                    "input": {"order_id": "A-1001"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": '{"status": "shipped"}',
                }
            ],
        },
    ]


async def test_anthropic_sends_tool_schema_as_input_schema(
    claude: AnthropicModel, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.script(
        Reply(body=anthropic_message([{"type": "text", "text": "a"}])),
        Reply(body=anthropic_message([{"type": "text", "text": "b"}])),
    )
    messages: list[Message] = [{"role": "user", "content": "hi"}]

    await claude.request(messages, [LOOKUP])
    await claude.request(messages, [])

    with_tools, without_tools = (r.body for r in anthropic_server.requests)
    assert with_tools["tools"] == [
        {
            "name": "lookup_order",
            "description": "Look up an order by its id.",
            "input_schema": LOOKUP.parameters,
        }
    ]
    assert "tools" not in without_tools
    assert "system" not in without_tools


async def test_anthropic_usage_prices_under_the_requested_model_name(
    claude: AnthropicModel, anthropic_server: FakeLLMServer
) -> None:
    anthropic_server.script(
        Reply(
            body=anthropic_message(
                [{"type": "text", "text": "ok"}], input_tokens=1000, output_tokens=500
            )
        )
    )

    resp = await claude.request([{"role": "user", "content": "hi"}], [])

    assert resp.usage == Usage(input_tokens=1000, output_tokens=500)
    assert resp.model == "claude-haiku-4-5"
    assert spend_usd(resp.model, resp.usage) == pytest.approx((1000 * 1.00 + 500 * 5.00) / 1e6)


async def test_anthropic_400_becomes_model_error_with_status_and_provider_message(
    claude: AnthropicModel, anthropic_server: FakeLLMServer
) -> None:
    error = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages: roles must alternate"},
    }
    anthropic_server.script(Reply(status=400, body=error))

    with pytest.raises(ModelError) as caught:
        await claude.request([{"role": "user", "content": "hi"}], [])

    assert "HTTP 400" in caught.value.message
    assert "messages: roles must alternate" in caught.value.message
    assert type(caught.value.__cause__).__name__ == "BadRequestError"


async def test_anthropic_500_without_retries_becomes_model_error_after_one_attempt(
    claude: AnthropicModel, anthropic_server: FakeLLMServer
) -> None:
    error = {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
    anthropic_server.script(Reply(status=500, body=error))

    with pytest.raises(ModelError, match=r"HTTP 500: Internal server error"):
        await claude.request([{"role": "user", "content": "hi"}], [])

    assert len(anthropic_server.requests) == 1


async def test_anthropic_unreachable_server_becomes_model_error() -> None:
    model = AnthropicModel(
        "claude-haiku-4-5", base_url=f"http://127.0.0.1:{unused_port()}", max_retries=0
    )
    try:
        with pytest.raises(ModelError, match="could not be reached") as caught:
            await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()
    assert caught.value.transient


async def test_anthropic_timeout_is_a_transient_model_error(
    anthropic_server: FakeLLMServer,
) -> None:
    anthropic_server.script(Reply.hung())
    model = AnthropicModel(
        "claude-haiku-4-5", base_url=anthropic_server.url, timeout_s=0.2, max_retries=0
    )
    try:
        with pytest.raises(ModelError, match=r"timed out after 0\.2s") as caught:
            await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()
    assert caught.value.transient and caught.value.status is None


async def test_anthropic_reads_base_url_and_key_from_the_environment(
    anthropic_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    anthropic_server.script(Reply(body=anthropic_message([{"type": "text", "text": "ok"}])))
    model = AnthropicModel("claude-haiku-4-5", max_retries=0)
    try:
        await model.request([{"role": "user", "content": "hi"}], [])
    finally:
        await model.aclose()

    assert model.name == "anthropic:claude-haiku-4-5"
    assert anthropic_server.requests[0].headers["x-api-key"] == "sk-ant-from-env"


def test_anthropic_without_key_or_base_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-haiku-4-5")


# reference §10: transient = 408, 409, 429, 5xx (529 included); permanent = every other 4xx.
CLASSIFIED = [
    *((status, True) for status in (408, 409, 429, 500, 502, 503, 529)),
    *((status, False) for status in (400, 401, 403, 404, 422)),
]


@pytest.mark.parametrize(("status", "transient"), CLASSIFIED)
async def test_openai_http_failure_is_transient_exactly_for_the_retryable_statuses(
    gpt: OpenAIChatModel, openai_server: FakeLLMServer, status: int, transient: bool
) -> None:
    openai_server.script(Reply.failure(status, f"provider says {status}"))

    with pytest.raises(ModelError) as caught:
        await gpt.request([{"role": "user", "content": "hi"}], [])

    assert caught.value.status == status
    assert caught.value.transient is transient
    assert f"HTTP {status}: provider says {status}" in caught.value.message
    assert len(openai_server.requests) == 1


@pytest.mark.parametrize(("status", "transient"), CLASSIFIED)
async def test_anthropic_http_failure_is_transient_exactly_for_the_retryable_statuses(
    claude: AnthropicModel, anthropic_server: FakeLLMServer, status: int, transient: bool
) -> None:
    anthropic_server.script(Reply.failure(status, f"provider says {status}"))

    with pytest.raises(ModelError) as caught:
        await claude.request([{"role": "user", "content": "hi"}], [])

    assert caught.value.status == status
    assert caught.value.transient is transient
    assert f"HTTP {status}: provider says {status}" in caught.value.message
    assert len(anthropic_server.requests) == 1
