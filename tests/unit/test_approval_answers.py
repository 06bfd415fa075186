"""What a decision answers for the calls of a turn its request carried out
(``approvals/answers.py``, reference §15): the decider's own call as carried out, and every
other call, in call order, as it was carried out, on the result or on the refusal; a
``changed`` call after a write says so; never ``recorded`` for a call carried out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tether._runtime.step.decided_call import Resolution
from tether.approvals import answers
from tether.errors import CallAnswer, Changed, GuardFailed, PendingToolUnavailable
from tether.notify import Notice
from tether.results import CallVerdict, Choice, Outcome, StopKind
from tether.runs import RunState

RUN = "r1"
EXECUTED = Resolution(verdict=CallVerdict.EXECUTED)
DECLINED = Resolution(verdict=CallVerdict.DECLINED)


def changed() -> Resolution:
    notice = Notice(
        run_id=RUN,
        user_id="dana",
        token="t2",
        approve_url="/approve/t2",
        tool="pay",
        arguments={"amount": 20},
        preview={"balance_after": 50},
        expires_at="2026-12-06T17:00:00+00:00",
        tool_call_id="b",
    )
    outcome = Outcome(run_id=RUN, kind=StopKind.SUSPENDED, notice=notice, notices=[notice])
    diff = [{"path": "balance_after", "before": 80, "after": 50}]
    return Resolution(verdict=CallVerdict.CHANGED, outcome=outcome, diff=diff)


def shown(carried: Sequence[CallAnswer]) -> list[tuple[str, str]]:
    return [(c.tool_call_id, c.to_json()["outcome"]) for c in carried]


def test_the_decider_whose_call_ran_is_answered_with_a_later_call_changed_beside_it() -> None:
    carried = {"a": EXECUTED, "b": changed()}
    result = answers.answered(
        RUN, Choice.APPROVE, "a", carried, RunState.SUSPENDED, fallback=EXECUTED
    )
    assert (result.outcome, result.state) == (CallVerdict.EXECUTED, RunState.SUSPENDED)
    assert shown(result.carried) == [("b", "changed")]
    later = result.to_json()["carried"][0]
    assert later["ok"] is False and later["token"] == "t2" and later["diff"][0]["after"] == 50
    assert "carried out before it" in later["message"]  # a write ran before it


def test_a_refused_decider_carries_the_calls_carried_out_before_it() -> None:
    for refusal, error in (
        (changed(), Changed),
        (Resolution(verdict=CallVerdict.GUARD_FAILED, reason="held"), GuardFailed),
        (Resolution(verdict=CallVerdict.TOOL_UNAVAILABLE, reason="gone"), PendingToolUnavailable),
    ):
        carried = {"x": DECLINED, "a": EXECUTED, "b": refusal}
        with pytest.raises(error) as raised:
            answers.answered(RUN, Choice.APPROVE, "b", carried, RunState.HALTED, fallback=refusal)
        assert shown(raised.value.carried) == [("x", "declined"), ("a", "executed")]
        body = raised.value.to_dict()
        assert body["error"] == error.code
        assert [c["outcome"] for c in body["carried"]] == ["declined", "executed"]


def test_a_changed_call_with_no_write_before_it_does_not_blame_the_turn() -> None:
    carried = {"x": DECLINED, "b": changed()}
    with pytest.raises(Changed) as raised:
        answers.answered(RUN, Choice.APPROVE, "b", carried, RunState.SUSPENDED, fallback=DECLINED)
    assert "carried out before it" not in raised.value.message


def test_a_decider_not_reached_is_recorded_and_the_others_as_carried_out() -> None:
    result = answers.recorded(RUN, Choice.DECLINE, {"a": changed()}, waiting_for=1)
    assert (result.outcome, result.waiting_for, result.decision) == (
        CallVerdict.RECORDED,
        1,
        Choice.DECLINE,
    )
    assert shown(result.carried) == [("a", "changed")]


def test_a_handed_over_call_answers_reconciling_and_the_call_before_it_executed() -> None:
    reconciling = Resolution(verdict=CallVerdict.RECONCILING)
    carried = {"a": EXECUTED, "b": reconciling}
    mine = answers.answered(
        RUN, Choice.APPROVE, "a", carried, RunState.RUNNING, fallback=reconciling
    )
    assert mine.outcome is CallVerdict.EXECUTED  # its own write ran before the hand-over
    assert shown(mine.carried) == [("b", "reconciling")]
    later = answers.answered(
        RUN, Choice.APPROVE, "c", carried, RunState.RUNNING, fallback=reconciling
    )
    assert later.outcome is CallVerdict.RECONCILING  # not reached: the run was handed over
    assert shown(later.carried) == [("a", "executed"), ("b", "reconciling")]
