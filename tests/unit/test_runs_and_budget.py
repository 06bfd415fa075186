"""The transition table, budgets and limits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.budget import Budget, Limits, parse_limits
from tether.errors import InvalidInput
from tether.runs import TERMINAL, TRANSITIONS, RunState, can_transition


def test_terminal_states_have_no_way_out() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        for target in RunState:
            assert not can_transition(state, target)


def test_the_table_refuses_illegal_transitions() -> None:
    assert not can_transition(RunState.HALTED, RunState.SUSPENDED)
    assert not can_transition(RunState.SUSPENDED, RunState.ANSWERED)
    assert not can_transition(RunState.ANSWERED, RunState.RUNNING)
    assert can_transition(RunState.SUSPENDED, RunState.RUNNING)
    assert can_transition(RunState.HALTED, RunState.RUNNING)
    assert can_transition(RunState.RUNNING, RunState.SUSPENDED)


def test_halted_is_not_terminal_and_every_state_is_in_the_table() -> None:
    assert not RunState.HALTED.terminal
    assert set(TRANSITIONS) == set(RunState)


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        (Budget(steps=5), "max_steps"),
        (Budget(spend_usd=1.0), "max_spend"),
        (Budget(elapsed_ms=10), "max_elapsed"),
    ],
)
def test_model_call_checks(budget: Budget, reason: str) -> None:
    limits = Limits(max_steps=5, max_spend_usd=1.0, max_tool_calls=3, max_elapsed_ms=10)
    assert budget.check_before_model_call(limits) == reason


def test_tool_call_checks() -> None:
    limits = Limits(max_tool_calls=3, max_elapsed_ms=10)
    assert Budget(tool_calls=3).check_before_tool_call(limits) == "max_tool_calls"
    assert Budget(tool_calls=2).check_before_tool_call(limits) is None


def test_default_continuation_grant_is_spec_6() -> None:
    grant = Limits(
        max_steps=10, max_spend_usd=2.0, max_tool_calls=8, max_elapsed_ms=1000
    ).extended()
    assert grant == Limits(max_steps=14, max_spend_usd=3.0, max_tool_calls=12, max_elapsed_ms=1500)


@pytest.mark.parametrize(
    "bad",
    [{"max_steps": 0}, {"max_steps": -1}, {"max_spend_usd": "lots"}, {"unknown": 1}, "x"],
)
def test_bad_limits_are_a_clear_error(bad: object) -> None:
    with pytest.raises(InvalidInput):
        parse_limits(bad)


@given(
    steps=st.integers(1, 10_000),
    spend=st.floats(0.001, 1000, allow_nan=False),
    calls=st.integers(1, 10_000),
    elapsed=st.integers(1, 10**9),
)
def test_a_grant_never_lowers_a_limit(steps: int, spend: float, calls: int, elapsed: int) -> None:
    limits = Limits(
        max_steps=steps, max_spend_usd=spend, max_tool_calls=calls, max_elapsed_ms=elapsed
    )
    grant = limits.extended()
    assert grant.max_steps > limits.max_steps
    assert grant.max_spend_usd >= limits.max_spend_usd
    assert grant.max_tool_calls > limits.max_tool_calls
    assert grant.max_elapsed_ms >= limits.max_elapsed_ms
