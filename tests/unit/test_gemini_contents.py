"""The Gemini adapter's translation of a run's messages and tools (``tether.models.gemini``),
which needs no server: system messages joined, the assistant as ``model`` with function
calls that carry the placeholder thought signature, each tool result named after the call
it answers and in one user turn with its neighbours, arguments that are not an object and
results of calls never made refused. The adapter over the wire is
tests/integration/test_gemini_adapter.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tether.errors import ModelError
from tether.models.base import ToolSpec
from tether.models.gemini import SKIP_THOUGHT_SIGNATURE, to_gemini_contents, to_gemini_tools


def tool_call(call_id: str, order_id: str, name: str = "lookup_order") -> dict[str, Any]:
    arguments = json.dumps({"order_id": order_id})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_placeholder_signature_is_the_documented_text_on_the_wire() -> None:
    encoded = base64.urlsafe_b64encode(SKIP_THOUGHT_SIGNATURE).decode()
    assert encoded == "skip_thought_signature_validator"


def test_calls_their_results_and_a_user_message_after_them_make_three_turns() -> None:
    system, contents = to_gemini_contents(
        [
            {"role": "system", "content": "Rule one."},
            {"role": "system", "content": [{"type": "text", "text": "Rule two."}]},
            {"role": "user", "content": "Compare A-1 and B-2."},
            {
                "role": "assistant",
                "content": "Looking both up.",
                "tool_calls": [tool_call("call_1", "A-1"), tool_call("toolu_2", "B-2", "find")],
            },
            {"role": "tool", "tool_call_id": "toolu_2", "content": "pending"},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
            {"role": "user", "content": "Be brief."},
        ]
    )

    assert system == "Rule one.\n\nRule two."
    assert contents == [
        {"role": "user", "parts": [{"text": "Compare A-1 and B-2."}]},
        {
            "role": "model",
            "parts": [
                {"text": "Looking both up."},
                {
                    "function_call": {
                        "name": "lookup_order",
                        "args": {"order_id": "A-1"},
                        "id": "call_1",
                    },
                    "thought_signature": SKIP_THOUGHT_SIGNATURE,
                },
                {
                    "function_call": {"name": "find", "args": {"order_id": "B-2"}, "id": "toolu_2"},
                    "thought_signature": SKIP_THOUGHT_SIGNATURE,
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                # Each result is named after the call it answers, in the order they came.
                {
                    "function_response": {
                        "id": "toolu_2",
                        "name": "find",
                        "response": {"output": "pending"},
                    }
                },
                {
                    "function_response": {
                        "id": "call_1",
                        "name": "lookup_order",
                        "response": {"status": "shipped"},
                    }
                },
                {"text": "Be brief."},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("content", "response"),
    [
        ('{"status": "shipped", "eta": 2}', {"status": "shipped", "eta": 2}),
        ("[1, 2]", {"output": [1, 2]}),
        ('"quoted"', {"output": "quoted"}),
        ("42", {"output": 42}),
        ("not json at all", {"output": "not json at all"}),
        ("", {"output": ""}),
        ([{"type": "text", "text": '{"ok": true}'}], {"ok": True}),
    ],
)
def test_a_tool_result_is_its_object_or_its_value_as_output(
    content: Any, response: dict[str, Any]
) -> None:
    _, contents = to_gemini_contents(
        [
            {"role": "assistant", "content": None, "tool_calls": [tool_call("c", "A-1")]},
            {"role": "tool", "tool_call_id": "c", "content": content},
        ]
    )

    assert contents[1]["parts"][0]["function_response"]["response"] == response


def test_empty_turns_are_dropped_and_their_neighbours_merge() -> None:
    _, contents = to_gemini_contents(
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "two"},
        ]
    )

    assert contents == [{"role": "user", "parts": [{"text": "one"}, {"text": "two"}]}]


def test_a_call_without_an_id_is_sent_without_one() -> None:
    call = tool_call("", "A-1")

    _, contents = to_gemini_contents([{"role": "assistant", "content": None, "tool_calls": [call]}])

    assert contents[0]["parts"][0]["function_call"] == {
        "name": "lookup_order",
        "args": {"order_id": "A-1"},
    }


@pytest.mark.parametrize("arguments", ["[1, 2]", "not json", '"a string"'])
def test_arguments_that_are_not_a_json_object_are_refused(arguments: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}

    with pytest.raises(ModelError, match="not a JSON object"):
        to_gemini_contents([{"role": "assistant", "content": None, "tool_calls": [call]}])


def test_a_result_of_a_call_no_assistant_turn_made_is_refused() -> None:
    with pytest.raises(ModelError, match="'call_9'"):
        to_gemini_contents(
            [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "call_9", "content": "ok"},
            ]
        )


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ModelError, match="'developer'"):
        to_gemini_contents([{"role": "developer", "content": "hi"}])


def test_tools_are_one_tool_of_declarations_with_their_schemas_as_written() -> None:
    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
        "additionalProperties": False,
    }
    tools = [
        ToolSpec(name="lookup_order", description="Look up an order.", parameters=schema),
        ToolSpec(name="now", description="The time.", parameters={}),
    ]

    assert to_gemini_tools(tools) == [
        {
            "function_declarations": [
                {
                    "name": "lookup_order",
                    "description": "Look up an order.",
                    "parameters_json_schema": schema,
                },
                {"name": "now", "description": "The time."},
            ]
        }
    ]
    assert to_gemini_tools([]) == []
