"""Tools from typed functions, digests, failpoints, message helpers, the scripted model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from tether import ToolContext, tool
from tether.errors import ConfigError, FailpointError
from tether.failpoints import POINTS, fail, parse, set_failpoint
from tether.messages import pending_tool_calls, tool_result, tool_results
from tether.models.base import Message, Usage
from tether.models.pricing import DEFAULT_PRICE, price_for, spend_usd
from tether.models.scripted import ScriptedModel
from tether.models.sdk import PLACEHOLDER_API_KEY, sdk_credentials
from tether.previews import diff_previews, digest
from tether.tools.tool import Effect, InvalidToolArguments


@tool(effect="write", needs_confirmation=True, dedupes=True)
def send_quote(ctx: ToolContext, quote_id: str, copies: int = 1) -> dict[str, str]:
    """Send a quote."""
    return {"sent": quote_id}


def test_a_tool_from_a_typed_function_has_a_schema_and_effect() -> None:
    spec = send_quote.spec()
    assert spec.name == "send_quote"
    assert spec.description == "Send a quote."
    assert spec.parameters["properties"]["quote_id"]["type"] == "string"
    assert spec.parameters["required"] == ["quote_id"]
    assert "ctx" not in spec.parameters["properties"]
    assert send_quote.effect is Effect.WRITE and send_quote.needs_confirmation


@pytest.mark.parametrize("raw", [{"quote_id": 5}, {}, {"quote_id": "Q", "extra": 1}, "Q", None])
def test_bad_arguments_are_refused_with_a_reason(raw: object) -> None:
    with pytest.raises(InvalidToolArguments, match="send_quote"):
        send_quote.validate(raw)


@tool
def order(quantity: Annotated[int, Field(gt=0, le=1000)]) -> dict[str, int]:
    """Order a quantity."""
    return {"ordered": quantity}


def test_annotated_constraints_of_a_tools_parameters_hold_and_reach_its_schema() -> None:
    assert order.validate({"quantity": 5}).model_dump() == {"quantity": 5}
    for bad in (0, -2, 1001):
        with pytest.raises(InvalidToolArguments, match="quantity"):
            order.validate({"quantity": bad})
    schema = order.spec().parameters["properties"]["quantity"]
    assert schema["exclusiveMinimum"] == 0 and schema["maximum"] == 1000


@given(st.dictionaries(st.text(max_size=5), st.integers(), max_size=6))
def test_the_digest_ignores_key_order(preview: dict[str, int]) -> None:
    reordered = dict(reversed(list(preview.items())))
    assert digest(preview) == digest(reordered)
    assert len(digest(preview)) == 64


def test_the_digest_sees_a_changed_value() -> None:
    assert digest({"total": 100}) != digest({"total": 101})


def test_diff_lists_changed_paths() -> None:
    before = {"tier": "silver", "lines": [{"price": 10}], "total": 10}
    after = {"tier": "gold", "lines": [{"price": 9}], "total": 10}
    assert diff_previews(before, after) == [
        {"path": "lines[0].price", "before": 10, "after": 9},
        {"path": "tier", "before": "silver", "after": "gold"},
    ]


def test_pending_tool_calls_are_the_last_turns_unanswered_ones() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "a", "function": {"name": "t", "arguments": "{}"}},
                {"id": "b", "function": {"name": "t", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
    ]
    assert [c.id for c in pending_tool_calls(messages)] == ["b"]
    assert (
        pending_tool_calls([*messages, {"role": "tool", "tool_call_id": "b", "content": ""}]) == []
    )


def test_failpoints_parse_and_fire() -> None:
    assert parse("after_intent=crash,after_tool_commit:send=error") == {
        ("after_intent", None): "crash",
        ("after_tool_commit", "send"): "error",
    }
    with pytest.raises(ConfigError):
        parse("nowhere=crash")
    with pytest.raises(ConfigError):
        parse("after_intent=explode")
    set_failpoint("after_claim", "error", tool="send")
    fail("after_claim", "other")  # a different tool: nothing happens
    with pytest.raises(FailpointError):
        fail("after_claim", "send")


def test_every_failpoint_is_listed_in_the_step_protocol_doc() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "step-protocol.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)(?:\[?:TOOL\]?)?`", doc, re.M))
    assert [point for point in POINTS if point not in listed] == []


def test_every_failpoint_is_crashed_at_by_an_acceptance_test() -> None:
    """Reference §7: a test kills a real process at each failpoint. Each name appears,
    armed with ``=crash`` (``NAME=crash`` or ``NAME:TOOL=crash``), in a test that starts
    processes (``tests/acceptance``)."""
    acceptance = Path(__file__).resolve().parents[1] / "acceptance"
    text = "\n".join(p.read_text() for p in sorted(acceptance.glob("test_*.py")))
    armed = set(re.findall(r"\b([a-z_]+)(?::[\w{}]+)?=crash\b", text))
    assert [point for point in POINTS if point not in armed] == []


def test_an_unknown_model_gets_the_default_price() -> None:
    assert price_for("no-such-model") == DEFAULT_PRICE
    assert spend_usd("scripted", Usage(input_tokens=1_000_000, output_tokens=0)) == 1.0


async def test_the_scripted_model_plays_the_turn_for_the_history() -> None:
    model = ScriptedModel([{"content": "one"}, {"tool_calls": [{"name": "t", "arguments": {}}]}])
    first = await model.request([{"role": "user", "content": "x"}], [])
    assert first.message["content"] == "one"
    second = await model.request([{"role": "user"}, {"role": "assistant", "content": "one"}], [])
    assert second.message["tool_calls"][0]["id"] == "call_1_0"


def test_a_malformed_script_is_a_config_error(tmp_path: object) -> None:
    with pytest.raises(ConfigError):
        ScriptedModel([{"contents": "typo"}])


async def test_the_scripted_model_can_use_an_earlier_tool_result() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "draft", "arguments": {}}]},
            {"tool_calls": [{"name": "send", "arguments": {"quote_id": "${draft.quote_id}"}}]},
        ]
    )
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "draft", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"quote_id": "Q-1001"}'},
    ]
    response = await model.request(history, [])
    assert response.message["tool_calls"][0]["function"]["arguments"] == '{"quote_id": "Q-1001"}'


def test_an_sdk_client_without_credentials_is_refused_unless_a_local_server_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("K1", "K2", "BASE"):
        monkeypatch.delenv(var, raising=False)

    def credentials(api_key: str | None, base_url: str | None) -> tuple[str | None, str | None]:
        return sdk_credentials(
            "m", api_key=api_key, base_url=base_url, key_vars=("K1", "K2"), base_var="BASE"
        )

    with pytest.raises(ConfigError, match="m needs an API key: set K1, or BASE"):
        credentials(None, None)
    assert credentials("k", None) == ("k", None)
    assert credentials(None, "http://x") == (PLACEHOLDER_API_KEY, "http://x")
    monkeypatch.setenv("K2", "from-env")
    monkeypatch.setenv("BASE", "http://env")
    # The SDK reads the key from the environment itself; the base URL is resolved here.
    assert credentials(None, None) == (None, "http://env")


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    ).filter(lambda value: not isinstance(value, str))
)
def test_a_stored_tool_result_reads_back_as_the_value_the_tool_gave(value: Any) -> None:
    """The ledger's results are read from their messages (stored once): ``tool_results``
    is the inverse of ``tool_result`` for JSON values, keeps text as text, and skips
    every message that is not a tool result."""
    stored: list[Message] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": []},
        tool_result("c1", value),
        tool_result("c2", "plain words, not JSON"),
    ]
    assert tool_results(stored) == {"c1": value, "c2": "plain words, not JSON"}
