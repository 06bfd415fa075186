"""The step boundary of a fork (reference §12, "Steps and the fork's boundary"): through
step K is every message before the (K+1)-th assistant message, and K's calls must all have
results."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import InvalidInput
from tether.messages import step_boundary

SUSPENDED: list[dict[str, Any]] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "q"},
    {"role": "assistant", "tool_calls": [{"id": "r1"}]},
    {"role": "tool", "tool_call_id": "r1", "content": "{}"},
    {"role": "assistant", "tool_calls": [{"id": "w1"}]},  # waits for its decision
]


@pytest.mark.parametrize(
    ("messages", "at_step", "cut"),
    [
        # An answer with no tool calls: a boundary, and all messages when it is the last.
        ([{"role": "system"}, {"role": "user"}, {"role": "assistant", "content": "x"}], 1, 3),
        (
            [
                {"role": "user"},
                {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]},
                {"role": "tool", "tool_call_id": "b"},
                {"role": "tool", "tool_call_id": "a"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": "y"},
            ],
            1,
            5,
        ),
    ],
)
def test_the_boundary_of_step_k_is_the_next_assistant_message_or_the_end(
    messages: list[dict[str, Any]], at_step: int, cut: int
) -> None:
    assert step_boundary(messages, at_step) == cut


def test_a_result_of_another_step_does_not_close_step_k() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "tool_calls": [{"id": "a"}]},
        {"role": "assistant", "tool_calls": [{"id": "b"}]},
        {"role": "tool", "tool_call_id": "a"},
    ]
    with pytest.raises(InvalidInput, match="step 1 has tool calls without a result"):
        step_boundary(messages, 1)
    with pytest.raises(InvalidInput, match="between 1 and the run's step count \\(0\\)"):
        step_boundary([{"role": "user"}], 1)


@pytest.mark.parametrize(
    ("at_step", "message"),
    [
        (0, "between 1 and the run's step count (2)"),
        (3, "between 1 and the run's step count (2)"),
        (2, "step 2 has tool calls without a result yet"),
        (True, "must be an integer"),
        (False, "must be an integer"),
        ("1", "must be an integer"),
        (1.0, "must be an integer"),
        (None, "must be an integer"),
    ],
)
def test_a_step_out_of_range_unfinished_or_not_an_int_is_invalid_input(
    at_step: Any, message: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        step_boundary(SUSPENDED, at_step)
    assert message in str(refused.value)
    assert step_boundary(SUSPENDED, 1) == 4
