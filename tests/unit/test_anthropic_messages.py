"""The Anthropic adapter's translation of a run's messages (``tether.models.anthropic``),
which needs no server: system messages joined, parallel tool results and a following user
message in one user turn, empty assistant turns dropped, arguments that are not an object
refused. The adapters over the wire are tests/integration/test_model_adapters.py."""

from __future__ import annotations

import json

import pytest

from tether.errors import ModelError
from tether.models.anthropic import to_anthropic_messages


def test_parallel_tool_results_and_a_following_user_message_share_one_user_turn() -> None:
    calls = [
        {
            "id": f"toolu_{i}",
            "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": f"A-{i}"})},
        }
        for i in (1, 2)
    ]
    system, turns = to_anthropic_messages(
        [
            {"role": "system", "content": "Rule one."},
            {"role": "system", "content": [{"type": "text", "text": "Rule two."}]},
            {"role": "user", "content": "Compare A-1 and A-2."},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "shipped"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "pending"},
            {"role": "user", "content": "Be brief."},
        ]
    )

    assert system == "Rule one.\n\nRule two."
    assert [turn["role"] for turn in turns] == ["user", "assistant", "user"]
    assert [block["id"] for block in turns[1]["content"]] == ["toolu_1", "toolu_2"]
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "shipped"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "pending"},
        {"type": "text", "text": "Be brief."},
    ]


def test_empty_assistant_turns_are_dropped_and_neighbours_merge() -> None:
    _, turns = to_anthropic_messages(
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "two"},
        ]
    )

    assert turns == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]


def test_tool_call_arguments_that_are_not_an_object_are_a_model_error() -> None:
    bad_call = {
        "id": "toolu_9",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": "not json"},
    }

    with pytest.raises(ModelError, match="toolu_9"):
        to_anthropic_messages([{"role": "assistant", "content": None, "tool_calls": [bad_call]}])
