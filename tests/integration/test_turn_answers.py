"""What a decision answers for each call of a turn it carried out (reference §15), on both
backends, with payments whose previews read the balance they move (``payments.py``): once
the first payment is carried out, the next one's preview differs from the one approved and
it is ``changed``. Every call a request carried out answers as it was carried out
(``executed``, ``declined``, or its §4 error with that error's fields), in the request's
own answer (``carried``) and in the batch's ``results``, whichever call was refused, in
whatever order the batch names them, and whether the last decision came by token or by
batch; ``recorded`` is only for a call not carried out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import downstream
import payments
import pytest
from inbox_web import Web, web

from tether import StopKind
from tether.errors import Changed, NoLongerPermitted
from tether.notify import Notice
from tether.results import CallDecision, CallVerdict
from tether.runs import RunState


@pytest.fixture
async def pay(db_url: str) -> AsyncIterator[Web]:
    w = await web(db_url, model=payments.ByQuestion(), agent=payments.agent())
    yield w
    w.close()


async def suspended(w: Web, script: str = "two_payments") -> tuple[str, list[Notice]]:
    """dana's run suspended on its turn's payments, and their notices in call order."""
    outcome = await w.engine.ask("dana", f"script:{script} pay them")
    assert outcome.kind is StopKind.SUSPENDED
    return outcome.run_id, [n for n in w.notifier.notices if n.run_id == outcome.run_id]


def paid() -> list[str]:
    """The payments carried out downstream by the run, in order."""
    return [item for key, tool, item in downstream.effects() if tool == "pay" and key != "outside"]


def outcomes(answers: list[CallDecision]) -> list[tuple[str, str]]:
    return [(a.tool_call_id, a.to_json()["outcome"]) for a in answers]


def only(answers: list[CallDecision], call_id: str) -> dict[str, Any]:
    return next(a.to_json() for a in answers if a.tool_call_id == call_id)


async def test_a_batch_answers_the_payment_it_made_executed_though_the_next_one_changed(
    pay: Web,
) -> None:
    run_id, (first, second) = await suspended(pay)
    answers = await pay.engine.decide_calls(
        run_id,
        "dana",
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": second.tool_call_id, "decision": "approve"},
        ],
    )
    assert paid() == ["30"]  # the money moved
    assert outcomes(answers) == [(first.tool_call_id, "executed"), (second.tool_call_id, "changed")]
    done = only(answers, first.tool_call_id)
    assert done["ok"] is True and done["decision"] == "approve" and done["state"] == "suspended"
    changed = only(answers, second.tool_call_id)
    assert changed["ok"] is False and changed["error"] == "changed"
    assert changed["diff"] == [{"path": "balance_after", "before": 80, "after": 50}]
    assert "carried out before it" in changed["message"]  # why it changed
    # The refusal carries what its request carried out before it.
    assert [(c["tool_call_id"], c["outcome"]) for c in changed["carried"]] == [
        (first.tool_call_id, "executed")
    ]
    # The changed payment waits alone on its new preview and token, and runs on approval.
    view = await pay.engine.get_run(run_id)
    assert [c.pending.tool_call_id for c in view.run.pending_calls] == [second.tool_call_id]
    again = await pay.engine.resume_after_confirmation(changed["token"], "approve", "dana")
    assert again.outcome is CallVerdict.EXECUTED and again.carried == ()
    assert paid() == ["30", "20"]


async def test_the_batch_answers_the_same_truth_when_it_names_the_changed_payment_first(
    pay: Web,
) -> None:
    run_id, (first, second) = await suspended(pay)
    answers = await pay.engine.decide_calls(
        run_id,
        "dana",
        [
            {"tool_call_id": second.tool_call_id, "decision": "approve"},
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
        ],
    )
    assert paid() == ["30"]
    assert outcomes(answers) == [(second.tool_call_id, "changed"), (first.tool_call_id, "executed")]
    changed = only(answers, second.tool_call_id)
    # A refusal with its fields, never ``{"ok": true, "outcome": "changed"}`` without a diff.
    assert changed["ok"] is False and changed["diff"][0]["after"] == 50
    assert changed["token"] and changed["preview"] == {"amount": 20, "balance_after": 50}
    done = only(answers, first.tool_call_id)
    assert done["ok"] is True and done["state"] == "suspended"
    assert [(c["tool_call_id"], c["outcome"]) for c in done["carried"]] == [
        (second.tool_call_id, "changed")
    ]


async def test_the_last_decision_by_token_answers_with_the_calls_it_carried_out(
    pay: Web,
) -> None:
    _, (first, second) = await suspended(pay)
    recorded = await pay.engine.resume_after_confirmation(first.token, "approve", "dana")
    assert (recorded.outcome, recorded.carried) == (CallVerdict.RECORDED, ())  # not carried out
    with pytest.raises(Changed) as refused:
        await pay.engine.resume_after_confirmation(second.token, "approve", "dana")
    assert paid() == ["30"]
    assert [(c.tool_call_id, c.to_json()["outcome"]) for c in refused.value.carried] == [
        (first.tool_call_id, "executed")
    ]
    body = refused.value.to_dict()
    assert body["error"] == "changed" and body["carried"][0]["outcome"] == "executed"

    # The other way round: the changed payment decided first, the one that runs last.
    _, (first, second) = await suspended(pay)
    await pay.engine.resume_after_confirmation(second.token, "approve", "dana")
    last = await pay.engine.resume_after_confirmation(first.token, "approve", "dana")
    assert (last.outcome, last.state) == (CallVerdict.EXECUTED, RunState.SUSPENDED)
    (other,) = last.carried
    assert other.tool_call_id == second.tool_call_id and isinstance(other.refused, Changed)
    shown = last.to_json()["carried"][0]
    # The first run paid 30 already: approved with 50 left after it, it would leave 20.
    assert shown["error"] == "changed"
    assert shown["diff"] == [{"path": "balance_after", "before": 50, "after": 20}]


async def test_three_payments_with_a_decline_between_each_answer_as_carried_out(
    pay: Web,
) -> None:
    run_id, notices = await suspended(pay, "three_payments")
    ten, twenty, thirty = (n.tool_call_id for n in notices)
    answers = await pay.engine.decide_calls(
        run_id,
        "boss",
        [
            {"tool_call_id": ten, "decision": "approve"},
            {"tool_call_id": twenty, "decision": "decline", "reason": "not this one"},
            {"tool_call_id": thirty, "decision": "approve"},
        ],
    )
    assert paid() == ["10"]
    assert outcomes(answers) == [(ten, "executed"), (twenty, "declined"), (thirty, "changed")]
    assert only(answers, twenty)["ok"] is True and only(answers, twenty)["decision"] == "decline"
    assert only(answers, thirty)["diff"] == [{"path": "balance_after", "before": 70, "after": 60}]


async def test_a_payment_refused_by_its_guard_first_answers_its_refusal_and_the_next_runs(
    pay: Web,
) -> None:
    run_id, (first, second) = await suspended(pay)
    await pay.engine.resume_after_confirmation(first.token, "approve", "dana")
    downstream.set_world("cap", "25")  # the 30 is refused by the guard now; the 20 is not
    answers = await pay.engine.decide_calls(
        run_id, "dana", [{"tool_call_id": second.tool_call_id, "decision": "approve"}]
    )
    assert paid() == ["20"]
    (last,) = answers
    shown = last.to_json()
    assert shown["outcome"] == "executed" and shown["state"] == "running"
    assert [(c["tool_call_id"], c["outcome"], c["ok"]) for c in shown["carried"]] == [
        (first.tool_call_id, "guard_failed", False)
    ]
    assert shown["carried"][0]["reason"] == "payments above 25 are blocked"

    # Both in one batch: the refused one answers its refusal, not ``ok`` with a verdict.
    downstream.set_world("cap", "")
    run_id, (first, second) = await suspended(pay)
    downstream.set_world("cap", "25")
    answers = await pay.engine.decide_calls(
        run_id,
        "dana",
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": second.tool_call_id, "decision": "approve"},
        ],
    )
    refused = only(answers, first.tool_call_id)
    assert (refused["ok"], refused["outcome"], refused["error"]) == (
        False,
        "guard_failed",
        "guard_failed",
    )
    assert refused["reason"] == "payments above 25 are blocked"
    assert only(answers, second.tool_call_id)["outcome"] == "executed"


async def test_a_payment_no_longer_permitted_after_one_was_made_answers_both_truly(
    pay: Web,
) -> None:
    run_id, (first, second) = await suspended(pay)
    downstream.set_world("floor", "25")  # the 30 is still permitted; the 20 no longer is
    answers = await pay.engine.decide_calls(
        run_id,
        "dana",
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": second.tool_call_id, "decision": "approve"},
        ],
    )
    assert paid() == ["30"]
    assert outcomes(answers) == [
        (first.tool_call_id, "executed"),
        (second.tool_call_id, "no_longer_permitted"),
    ]
    assert only(answers, first.tool_call_id)["state"] == "halted"
    assert (await pay.run(run_id)).halt_reason == "no_longer_permitted"

    # By token: the refusal carries the payment made before it.
    downstream.set_world("floor", "")
    _, (first, second) = await suspended(pay)
    await pay.engine.resume_after_confirmation(first.token, "approve", "dana")
    downstream.set_world("floor", "25")
    with pytest.raises(NoLongerPermitted) as refused:
        await pay.engine.resume_after_confirmation(second.token, "approve", "dana")
    assert [c.to_json()["outcome"] for c in refused.value.carried] == ["executed"]
    assert paid() == ["30", "30"]


async def test_a_payment_changed_first_leaves_the_next_recorded_until_it_is_decided_again(
    pay: Web,
) -> None:
    run_id, (first, second) = await suspended(pay)
    payments.pay_outside(5)  # the balance moves before the decisions
    answers = await pay.engine.decide_calls(
        run_id,
        "dana",
        [
            {"tool_call_id": first.tool_call_id, "decision": "approve"},
            {"tool_call_id": second.tool_call_id, "decision": "approve"},
        ],
    )
    assert paid() == []
    changed = only(answers, first.tool_call_id)
    assert changed["outcome"] == "changed" and "carried out before it" not in changed["message"]
    assert changed["diff"] == [{"path": "balance_after", "before": 70, "after": 65}]
    waiting = only(answers, second.tool_call_id)  # not carried out: recorded is the truth
    assert (waiting["outcome"], waiting["waiting_for"]) == ("recorded", 1)
    # Decided again, the first runs; the second's decision stands and its re-check finds
    # the balance the first moved.
    again = await pay.engine.resume_after_confirmation(changed["token"], "approve", "dana")
    assert (again.outcome, again.state) == (CallVerdict.EXECUTED, RunState.SUSPENDED)
    shown = again.to_json()["carried"]
    assert [(c["tool_call_id"], c["outcome"]) for c in shown] == [(second.tool_call_id, "changed")]
    assert shown[0]["diff"] == [{"path": "balance_after", "before": 80, "after": 45}]
    assert paid() == ["30"]


async def test_the_http_answers_carry_the_calls_a_request_carried_out(pay: Web) -> None:
    run_id, (first, second) = await suspended(pay)
    auth = {"Authorization": f"Bearer {pay.keys['dana']}"}
    async with pay.client() as client:
        recorded = await client.post(
            f"/v1/approvals/{first.token}", json={"decision": "approve"}, headers=auth
        )
        assert recorded.status_code == 200 and recorded.json()["outcome"] == "recorded"
        assert "carried" not in recorded.json()
        refused = await client.post(
            f"/v1/approvals/{second.token}", json={"decision": "approve"}, headers=auth
        )
        assert refused.status_code == 409
        body = refused.json()
        assert body["error"] == "changed" and body["diff"][0]["after"] == 50
        assert [(c["tool_call_id"], c["outcome"]) for c in body["carried"]] == [
            (first.tool_call_id, "executed")
        ]

        # A decision that took effect answers with the calls it carried out beside it.
        _, (first, second) = await suspended(pay)
        for notice in (second, first):
            done = await client.post(
                f"/v1/approvals/{notice.token}", json={"decision": "approve"}, headers=auth
            )
        assert done.status_code == 200 and done.json()["outcome"] == "executed"
        assert [(c["tool_call_id"], c["outcome"]) for c in done.json()["carried"]] == [
            (second.tool_call_id, "changed")
        ]

        run_id, (first, second) = await suspended(pay)
        batch = await client.post(
            f"/v1/runs/{run_id}/decisions",
            json={
                "decisions": [
                    {"tool_call_id": first.tool_call_id, "decision": "approve"},
                    {"tool_call_id": second.tool_call_id, "decision": "approve"},
                ]
            },
            headers=auth,
        )
    assert batch.status_code == 200
    results = batch.json()["results"]
    assert [(r["tool_call_id"], r["outcome"]) for r in results] == [
        (first.tool_call_id, "executed"),
        (second.tool_call_id, "changed"),
    ]
    # Two runs paid 30 already: approved with 20 left after it, it would leave -10.
    assert results[1]["diff"] == [{"path": "balance_after", "before": 20, "after": -10}]
