"""The Gemini adapter (``gemini:MODEL``) against a loopback server that speaks the Gemini
API, through the official ``google-genai`` SDK over real HTTP.

What goes over the wire (the system instruction, function calls and the function responses
named after them, the tool schemas), the streamed text and usage, how failures surface,
transient or not (reference §10), including streams that break off, the credentials from
the environment, and a conversation that goes from one provider to another: a tool call
OpenAI or Anthropic wrote is answered to Gemini, and one Gemini wrote to them. The
translation alone is tests/unit/test_gemini_contents.py; the fake servers are
``tests/support/fakellm.py``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fakellm import (
    ANTHROPIC_PATH,
    GEMINI_PATH,
    OPENAI_PATH,
    Break,
    FakeLLMServer,
    Reply,
    anthropic_message,
    gemini_response,
    openai_completion,
    running,
)
from google import genai
from google.genai import types

from tether.errors import ConfigError, ModelError
from tether.models.anthropic import AnthropicModel
from tether.models.base import Message, ToolSpec, Usage
from tether.models.gemini import GeminiModel
from tether.models.openai import OpenAIChatModel
from tether.models.pricing import spend_usd

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
HI: list[Message] = [{"role": "user", "content": "hi"}]
TEXT = "Order A-1001 shipped on Monday and should arrive by Thursday."
# What the SDK sends for the placeholder thought signature of a call with none of its own.
SKIP = "skip_thought_signature_validator"
PROVIDER_ENV = (
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GEMINI_BASE_URL",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_GENAI_API_VERSION",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_ENTERPRISE",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_AUTH_TOKEN",
)


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a developer's real keys and endpoints out of these tests."""
    for name in PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeLLMServer]]:
    with (
        running(GEMINI_PATH) as gemini,
        running(OPENAI_PATH) as openai,
        running(ANTHROPIC_PATH) as anthropic,
    ):
        yield {"gemini": gemini, "openai": openai, "anthropic": anthropic}


@pytest.fixture
def server(servers: dict[str, FakeLLMServer]) -> FakeLLMServer:
    servers["gemini"].reset()
    return servers["gemini"]


def gemini_for(server: FakeLLMServer, **options: Any) -> GeminiModel:
    options = {"max_retries": 0, "api_key": "gm-test", **options}
    return GeminiModel("gemini-2.5-flash", base_url=server.url, **options)


@pytest.fixture
async def model(server: FakeLLMServer) -> AsyncIterator[GeminiModel]:
    adapter = gemini_for(server)
    yield adapter
    await adapter.aclose()


def call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A ``functionCall`` part as Gemini sends it (without an id unless given one)."""
    asked: dict[str, Any] = {"name": name, "args": arguments}
    if call_id:
        asked["id"] = call_id
    return {"functionCall": asked}


def schema_of(declaration: dict[str, Any]) -> Any:
    """A function declaration's JSON schema as sent: the API reads the field under its
    JSON name or its proto name, and this SDK sends the latter."""
    return declaration.get("parametersJsonSchema", declaration.get("parameters_json_schema"))


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- over the wire ----------------------------------------------------------------------


async def test_a_tool_call_round_trip_sends_the_system_instruction_the_call_and_its_result(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    server.script(
        Reply(
            body=gemini_response(
                [{"text": "Let me look that up."}, call("lookup_order", {"order_id": "A-1001"})]
            )
        ),
        Reply(body=gemini_response([{"text": "Order A-1001 has shipped."}])),
    )
    history: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is order A-1001?"},
    ]

    first = await model.request(history, [LOOKUP])
    # Gemini gave the call no id: the adapter names it, uniquely in the turn.
    assert first.message == {
        "role": "assistant",
        "content": "Let me look that up.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1001"}'},
            }
        ],
    }
    history.append(first.message)
    history.append({"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'})
    final = await model.request(history, [LOOKUP])

    assert final.message == {"role": "assistant", "content": "Order A-1001 has shipped."}
    sent = server.requests[1]
    assert sent.path == "/v1/models/gemini-2.5-flash:streamGenerateContent"
    assert sent.query == "alt=sse"
    assert sent.headers["x-goog-api-key"] == "gm-test"
    assert sent.body["systemInstruction"]["parts"] == [{"text": SYSTEM}]
    assert sent.body["contents"] == [
        {"role": "user", "parts": [{"text": "Where is order A-1001?"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Let me look that up."},
                {
                    "functionCall": {
                        "id": "call_1",
                        "name": "lookup_order",
                        "args": {"order_id": "A-1001"},
                    },
                    "thoughtSignature": SKIP,
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "call_1",
                        "name": "lookup_order",
                        "response": {"status": "shipped"},
                    }
                }
            ],
        },
    ]


async def test_tool_schemas_go_as_written_in_one_tool_and_no_tools_send_none(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    server.script(
        Reply(body=gemini_response([{"text": "a"}])), Reply(body=gemini_response([{"text": "b"}]))
    )

    await model.request(HI, [LOOKUP])
    await model.request(HI, [])

    with_tools, without_tools = (r.body for r in server.requests)
    [tool] = with_tools["tools"]
    [declaration] = tool["functionDeclarations"]
    assert declaration["name"] == "lookup_order"
    assert declaration["description"] == "Look up an order by its id."
    assert schema_of(declaration) == LOOKUP.parameters
    assert "tools" not in without_tools
    assert "systemInstruction" not in without_tools


async def test_the_text_reaches_on_text_in_pieces_and_thoughts_stay_out(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    thought = {"text": "The user wants the order's status.", "thought": True}
    server.script(Reply(body=gemini_response([thought, {"text": TEXT}])))
    pieces: list[str] = []

    response = await model.stream(HI, [], pieces.append)

    assert len(pieces) > 1 and all(pieces)
    assert "".join(pieces) == TEXT
    assert response.message == {"role": "assistant", "content": TEXT}


async def test_two_function_calls_of_one_turn_each_get_an_id_and_keep_gemini_s_own(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    calls = [
        call("lookup_order", {"order_id": "A-1001"}),
        call("lookup_order", {"order_id": "B-2002"}, call_id="fc-7"),
        call("lookup_order", {"order_id": "C-3003"}),
    ]
    server.script(Reply(body=gemini_response(calls)))
    pieces: list[str] = []

    response = await model.stream(HI, [LOOKUP], pieces.append)

    assert response.message["content"] is None
    assert [c["id"] for c in response.message["tool_calls"]] == ["call_1", "fc-7", "call_2"]
    assert [json.loads(c["function"]["arguments"]) for c in response.message["tool_calls"]] == [
        {"order_id": "A-1001"},
        {"order_id": "B-2002"},
        {"order_id": "C-3003"},
    ]
    assert pieces == []


async def test_usage_counts_tool_prompts_and_thinking_and_prices_under_the_requested_name(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    body = gemini_response(
        [{"text": "ok"}],
        prompt_tokens=1000,
        tool_use_prompt_tokens=200,
        output_tokens=500,
        thoughts_tokens=300,
    )
    server.script(Reply(body=body))

    response = await model.request(HI, [])

    assert response.usage == Usage(input_tokens=1200, output_tokens=800)
    # The server names a version; pricing keys on the name that was asked for.
    assert response.model == "gemini-2.5-flash"
    assert spend_usd(response.model, response.usage) == pytest.approx(
        (1200 * 0.30 + 800 * 2.50) / 1e6
    )


# --- failures ---------------------------------------------------------------------------

# reference §10: transient = 408, 409, 429, 5xx; permanent = every other 4xx.
CLASSIFIED = [
    *((status, True) for status in (408, 409, 429, 500, 503)),
    *((status, False) for status in (400, 401, 403, 404)),
]


@pytest.mark.parametrize(("status", "transient"), CLASSIFIED)
async def test_an_http_failure_is_transient_exactly_for_the_retryable_statuses(
    model: GeminiModel, server: FakeLLMServer, status: int, transient: bool
) -> None:
    server.script(Reply.failure(status, f"provider says {status}"))

    with pytest.raises(ModelError) as caught:
        await model.request(HI, [])

    assert caught.value.status == status
    assert caught.value.transient is transient
    assert f"gemini:gemini-2.5-flash failed with HTTP {status}: provider says {status}" in (
        caught.value.message
    )
    assert len(server.requests) == 1


async def test_the_sdk_retries_a_503_when_retries_are_allowed(server: FakeLLMServer) -> None:
    server.script(Reply.failure(503, "busy"), Reply(body=gemini_response([{"text": "recovered"}])))
    model = gemini_for(server, max_retries=1)
    try:
        response = await model.request(HI, [])
    finally:
        await model.aclose()

    assert response.message["content"] == "recovered"
    assert len(server.requests) == 2


async def test_a_prompt_gemini_blocks_is_a_permanent_error_that_says_so(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    blocked = {
        "promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
        "modelVersion": "gemini-2.5-flash-001",
    }
    server.script(Reply(body=blocked))

    with pytest.raises(ModelError) as caught:
        await model.request(HI, [])

    assert not caught.value.transient
    assert "blocked the prompt: SAFETY" in caught.value.message


async def test_a_timeout_is_transient(server: FakeLLMServer) -> None:
    server.script(Reply.hung())
    model = gemini_for(server, timeout_s=0.2)
    try:
        with pytest.raises(ModelError, match=r"timed out after 0\.2s") as caught:
            await model.request(HI, [])
    finally:
        await model.aclose()
    assert caught.value.transient and caught.value.status is None


async def test_an_unreachable_server_is_transient() -> None:
    model = GeminiModel(
        "gemini-2.5-flash", base_url=f"http://127.0.0.1:{unused_port()}", max_retries=0
    )
    try:
        with pytest.raises(ModelError, match="could not be reached") as caught:
            await model.request(HI, [])
    finally:
        await model.aclose()
    assert caught.value.transient and caught.value.status is None


async def broken_off(
    model: GeminiModel, server: FakeLLMServer, breaks: Break, error_type: str = "INTERNAL"
) -> tuple[ModelError, list[str]]:
    """The error of a call whose stream breaks off after its first text, and the text that
    reached ``on_text`` before it did."""
    server.script(Reply.broken(gemini_response([{"text": TEXT}]), breaks, error_type))
    pieces: list[str] = []
    with pytest.raises(ModelError) as caught:
        await model.stream(HI, [], pieces.append)
    return caught.value, pieces


@pytest.mark.parametrize("error_type", ["INTERNAL", "UNAVAILABLE", "RESOURCE_EXHAUSTED"])
async def test_a_server_error_in_the_middle_of_the_stream_is_transient(
    model: GeminiModel, server: FakeLLMServer, error_type: str
) -> None:
    error, pieces = await broken_off(model, server, "error", error_type)

    assert error.transient and error.status is None
    assert f"failed mid-stream ({error_type})" in error.message
    assert pieces and TEXT.startswith("".join(pieces))
    assert len(server.requests) == 1


async def test_an_invalid_argument_in_the_middle_of_the_stream_is_permanent(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    error, _ = await broken_off(model, server, "error", "INVALID_ARGUMENT")

    assert not error.transient
    assert "INVALID_ARGUMENT" in error.message


async def test_a_connection_dropped_in_the_middle_of_the_stream_is_transient(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    error, pieces = await broken_off(model, server, "drop")

    assert error.transient and error.status is None
    assert "broke off" in error.message
    assert pieces


async def test_a_stream_that_ends_without_a_finish_reason_is_transient(
    model: GeminiModel, server: FakeLLMServer
) -> None:
    error, pieces = await broken_off(model, server, "end")

    assert error.transient and error.status is None
    assert "ended its reply too soon" in error.message
    assert pieces


async def test_a_stream_that_stalls_past_the_timeout_is_a_transient_time_out(
    server: FakeLLMServer,
) -> None:
    model = gemini_for(server, timeout_s=0.2)
    try:
        error, pieces = await broken_off(model, server, "stall")
    finally:
        await model.aclose()

    assert error.transient and error.status is None
    assert "timed out after 0.2s" in error.message
    assert pieces


async def test_the_timeout_bounds_each_wait_not_the_whole_reply(server: FakeLLMServer) -> None:
    """A reply that takes longer than the timeout in all, but never waits so long for its
    next piece, is not cut off (the SDK's own timeout would bound the whole call)."""
    body = gemini_response([{"text": "one two three four"}])
    server.script(Reply(body=body, pause_s=0.4))
    model = gemini_for(server, timeout_s=1.0)
    pieces: list[str] = []
    try:
        response = await model.stream(HI, [], pieces.append)
    finally:
        await model.aclose()

    # Three pieces of text and the final chunk: four events, three pauses of 0.4 s.
    assert len(pieces) == 3
    assert response.message["content"] == "one two three four"


# --- credentials and the client ---------------------------------------------------------


@pytest.mark.parametrize("key_var", ["GEMINI_API_KEY", "GOOGLE_API_KEY"])
async def test_the_base_url_and_key_come_from_the_environment(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, key_var: str
) -> None:
    monkeypatch.setenv("GEMINI_BASE_URL", server.url)
    monkeypatch.setenv(key_var, "gm-from-env")
    server.script(Reply(body=gemini_response([{"text": "ok"}])))
    model = GeminiModel("gemini-2.5-flash", max_retries=0)
    try:
        await model.request(HI, [])
    finally:
        await model.aclose()

    assert model.name == "gemini:gemini-2.5-flash"
    assert server.requests[0].headers["x-goog-api-key"] == "gm-from-env"


async def test_gemini_api_key_comes_before_google_api_key(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "google-key")
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-key")
    server.script(Reply(body=gemini_response([{"text": "ok"}])))
    model = gemini_for(server, api_key=None)
    try:
        await model.request(HI, [])
    finally:
        await model.aclose()

    assert server.requests[0].headers["x-goog-api-key"] == "gemini-key"


async def test_a_local_server_needs_no_key(server: FakeLLMServer) -> None:
    server.script(Reply(body=gemini_response([{"text": "ok"}])))
    model = GeminiModel("gemma-3", base_url=server.url, max_retries=0)
    try:
        response = await model.request(HI, [])
    finally:
        await model.aclose()

    assert response.message["content"] == "ok"
    assert server.requests[0].headers["x-goog-api-key"] == "not-set"


def test_without_key_or_base_url_is_a_config_error_naming_gemini_api_key() -> None:
    with pytest.raises(ConfigError, match="GEMINI_API_KEY") as refused:
        GeminiModel("gemini-2.5-flash")
    assert refused.value.code == "invalid_config"


async def test_an_injected_client_is_used_and_left_open(server: FakeLLMServer) -> None:
    options = types.HttpOptions(
        base_url=server.url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    client = genai.Client(api_key="gm-injected", vertexai=False, http_options=options)
    server.script(
        Reply(body=gemini_response([{"text": "one"}])),
        Reply(body=gemini_response([{"text": "two"}])),
    )
    try:
        first = GeminiModel("gemini-2.5-flash", client=client)
        assert (await first.request(HI, [])).message["content"] == "one"
        await first.aclose()
        second = GeminiModel("gemini-2.5-flash", client=client)
        assert (await second.request(HI, [])).message["content"] == "two"
    finally:
        client.close()
        await client.aio.aclose()

    assert [r.headers["x-goog-api-key"] for r in server.requests] == ["gm-injected"] * 2


# --- from one provider to another -------------------------------------------------------


def history_with_call(call_id: str) -> list[Message]:
    """A conversation whose assistant turn (written by any provider) called a tool, and the
    tool's answer."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is order A-1001?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1001"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "shipped"},
    ]


@pytest.mark.parametrize("call_id", ["call_abc", "toolu_01A09q90qw90lq917835lq9"])
async def test_a_tool_call_openai_or_anthropic_wrote_is_answered_to_gemini(
    model: GeminiModel, server: FakeLLMServer, call_id: str
) -> None:
    server.script(Reply(body=gemini_response([{"text": "It has shipped."}])))

    response = await model.request(history_with_call(call_id), [LOOKUP])

    assert response.message["content"] == "It has shipped."
    contents = server.requests[0].body["contents"]
    assert contents[1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "id": call_id,
                        "name": "lookup_order",
                        "args": {"order_id": "A-1001"},
                    },
                    "thoughtSignature": SKIP,
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": call_id,
                        "name": "lookup_order",
                        "response": {"output": "shipped"},
                    }
                }
            ],
        },
    ]


async def gemini_written_history(model: GeminiModel, server: FakeLLMServer) -> list[Message]:
    """A conversation whose tool call Gemini wrote, as the adapter returned it."""
    server.script(Reply(body=gemini_response([call("lookup_order", {"order_id": "A-1001"})])))
    history: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is order A-1001?"},
    ]
    turn = await model.request(history, [LOOKUP])
    call_id = turn.message["tool_calls"][0]["id"]
    return [*history, turn.message, {"role": "tool", "tool_call_id": call_id, "content": "ok"}]


async def test_a_tool_call_gemini_wrote_is_answered_to_openai(
    model: GeminiModel, server: FakeLLMServer, servers: dict[str, FakeLLMServer]
) -> None:
    history = await gemini_written_history(model, server)
    openai_server = servers["openai"]
    openai_server.reset()
    openai_server.script(Reply(body=openai_completion(content="It has shipped.")))
    gpt = OpenAIChatModel(
        "gpt-4o-mini", base_url=f"{openai_server.url}/v1", api_key="sk-test", max_retries=0
    )
    try:
        response = await gpt.request(history, [LOOKUP])
    finally:
        await gpt.aclose()

    assert response.message["content"] == "It has shipped."
    sent = openai_server.requests[0].body["messages"]
    assert sent[2]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1001"}'},
        }
    ]
    assert sent[3] == {"role": "tool", "tool_call_id": "call_1", "content": "ok"}


async def test_a_tool_call_gemini_wrote_is_answered_to_anthropic(
    model: GeminiModel, server: FakeLLMServer, servers: dict[str, FakeLLMServer]
) -> None:
    history = await gemini_written_history(model, server)
    anthropic_server = servers["anthropic"]
    anthropic_server.reset()
    anthropic_server.script(
        Reply(body=anthropic_message([{"type": "text", "text": "It has shipped."}]))
    )
    claude = AnthropicModel(
        "claude-haiku-4-5", base_url=anthropic_server.url, api_key="sk-ant-test", max_retries=0
    )
    try:
        response = await claude.request(history, [LOOKUP])
    finally:
        await claude.aclose()

    assert response.message["content"] == "It has shipped."
    sent = anthropic_server.requests[0].body
    assert sent["system"] == SYSTEM
    assert sent["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "lookup_order",
                    "input": {"order_id": "A-1001"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}],
        },
    ]
