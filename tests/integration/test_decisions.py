"""Richer decisions (reference §9) through the Python API, on both backends: a decline's
reason reaches the model and every record of the decision; an approver's edit is
validated before anything is claimed, re-rendered, executed only on the digest the
approver saw, once, under the call's one key; previews never change anything; a
confirmation may depend on the call; and the race of mixed decisions on one token still
has one winner whose decision (reason and edits) every loser is told."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import agents
import downstream
import inprocess
import pytest
from pydantic import BaseModel

from tether import Agent, ApprovalResult, Engine, MemoryNotifier, Scope, StopKind, ToolContext, tool
from tether.config import Settings
from tether.errors import AlreadyResumed, Changed, InvalidInput, NotFound, UnknownOrExpired
from tether.models import ScriptedModel
from tether.runs import RunState
from tether.store import CallStatus


async def suspended(engine: Engine, notifier: MemoryNotifier) -> tuple[str, str]:
    outcome = await engine.ask("dana", "send b")
    assert outcome.kind is StopKind.SUSPENDED
    return outcome.run_id, notifier.last(outcome.run_id).token


def results(messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


@pytest.fixture
async def sending(db_url: str) -> Any:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    try:
        yield engine, notifier
    finally:
        engine.close()


async def test_a_decline_reason_reaches_the_model_the_decision_its_event_and_later_answers(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    result = await engine.resume_after_confirmation(
        token, "decline", "dana", reason="the customer asked to wait"
    )
    assert result.outcome.value == "declined"
    await engine.run_until_stop(run_id)
    view = await engine.get_run(run_id)
    assert results(view.messages)[-1] == {
        "error": "declined_by_user",
        "message": "the user declined this action",
        "reason": "the customer asked to wait",
    }
    (declined,) = [e.data for e in await engine.events(run_id) if e.kind == "declined"]
    assert declined == {
        "decision": "decline",
        "by": "dana",
        "reason": "the customer asked to wait",
        "tool_call_id": view.messages[-2]["tool_call_id"],
    }
    with pytest.raises(AlreadyResumed) as used:
        await engine.resume_after_confirmation(token, "approve", "dana")
    assert used.value.details["decision"]["reason"] == "the customer asked to wait"
    assert used.value.details["decision"]["decision"] == "decline"
    assert downstream.effects() == []


async def test_an_edit_approved_on_its_previews_digest_runs_once_under_the_same_key(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    before = (await engine.get_run(run_id)).run
    assert before.pending is not None
    call_id = before.pending.tool_call_id
    shown = await engine.preview_approval(token, "dana", {"item": "c"})
    assert shown.preview == {"item": "c", "price": "100"} and shown.digest is not None
    assert shown.digest != before.pending.digest
    result = await engine.resume_after_confirmation(
        token, "approve", "dana", arguments={"item": "c"}, digest=shown.digest, reason="c, not b"
    )
    assert result.outcome.value == "executed"
    await engine.run_until_stop(run_id)
    view = await engine.get_run(run_id)
    # The model's message is as it wrote it; its result says the call was edited.
    assistant = next(m for m in view.messages if m.get("role") == "assistant")
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"item": "b"}
    assert results(view.messages)[-1] == {
        "edited_by_user": {"arguments": {"item": "c"}},
        "result": {"done": "send", "item": "c"},
    }
    assert downstream.effects() == [(f"{run_id}:{call_id}", "send", "c")]
    (entry,) = [e for e in await engine.ledger(run_id) if e.tool == "send"]
    assert entry.arguments == {"item": "b"} and entry.edited_arguments == {"item": "c"}
    assert entry.status is CallStatus.OK
    (approved,) = [e.data for e in await engine.events(run_id) if e.kind == "approved"]
    assert approved["arguments_from"] == {"item": "b"}
    assert approved["arguments_to"] == {"item": "c"}
    assert approved["reason"] == "c, not b" and approved["by"] == "dana"
    with pytest.raises(AlreadyResumed) as used:
        await engine.resume_after_confirmation(token, "decline", "dana")
    assert used.value.details["decision"]["arguments"] == {"item": "c"}


async def test_an_edit_on_a_stale_digest_is_changed_then_the_edited_call_is_approved_by_new_token(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    with pytest.raises(Changed) as changed:
        # The digest of the pending preview, not of the edit: the approver did not see it.
        pending = (await engine.get_run(run_id)).run.pending
        assert pending is not None
        await engine.resume_after_confirmation(
            token, "approve", "dana", arguments={"item": "c"}, digest=pending.digest
        )
    assert changed.value.details["diff"] == [{"path": "item", "before": "b", "after": "c"}]
    again = (await engine.get_run(run_id)).run
    assert again.state is RunState.SUSPENDED and again.pending is not None
    assert again.pending.arguments == {"item": "c"}
    assert again.pending.edited_from == {"item": "b"}
    assert downstream.effects() == []
    new_token = changed.value.details["token"]
    assert new_token != token
    await engine.resume_after_confirmation(new_token, "approve", "dana")
    await engine.run_until_stop(run_id)
    view = await engine.get_run(run_id)
    # Approved later by a new token, without arguments: it still ran edited, and says so.
    assert results(view.messages)[-1]["edited_by_user"] == {"arguments": {"item": "c"}}
    assert [item for _, _, item in downstream.effects()] == ["c"]


async def test_invalid_input_changes_nothing_and_the_token_still_works(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    before = (await engine.get_run(run_id)).run
    bad: list[dict[str, Any]] = [
        {"decision": "approve", "arguments": {"item": 3}},  # not the tool's schema
        {"decision": "approve", "arguments": {"item": "c", "extra": 1}},
        {"decision": "approve", "arguments": ["c"]},  # not an object
        {"decision": "approve", "digest": "not-hex"},
        {"decision": "approve", "digest": "A" * 64},
        {"decision": "decline", "arguments": {"item": "c"}},  # arguments on a decline
        {"decision": "decline", "reason": "x" * 2001},
        {"decision": "decline", "reason": 5},
        {"decision": "maybe"},
    ]
    for body in bad:
        decision = body.pop("decision")
        with pytest.raises(InvalidInput):
            await engine.resume_after_confirmation(token, decision, "dana", **body)
    with pytest.raises(InvalidInput):
        await engine.preview_approval(token, "dana", {"item": 3})
    after = (await engine.get_run(run_id)).run
    assert after.state is RunState.SUSPENDED and after.pending == before.pending
    assert [e.kind for e in await engine.events(run_id)][-1] == "suspended"
    result = await engine.resume_after_confirmation(token, "approve", "dana")
    assert isinstance(result, ApprovalResult) and result.outcome.value == "executed"


async def test_a_preview_never_claims_nor_writes_and_answers_only_those_who_may_decide(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    before = (await engine.get_run(run_id)).run
    trace = await engine.events(run_id)
    as_pending = await engine.preview_approval(token, "dana")
    assert before.pending is not None
    assert as_pending.digest == before.pending.digest
    assert as_pending.arguments == {"item": "b"}
    for _ in range(3):
        await engine.preview_approval(token, "boss", {"item": "z"})
    with pytest.raises(UnknownOrExpired):
        await engine.preview_approval(token, "mallory", {"item": "z"})
    with pytest.raises(UnknownOrExpired):
        await engine.preview_approval("no-such-token", "dana")
    after = (await engine.get_run(run_id)).run
    assert after == before and await engine.events(run_id) == trace
    assert (await engine.resume_after_confirmation(token, "approve", "dana")).ok


async def test_twenty_mixed_decisions_on_one_token_have_one_winner_every_loser_is_told(
    db_url: str,
) -> None:
    notifier = MemoryNotifier()
    engines = [inprocess.engine(db_url, script_name="send", notifier=notifier) for _ in range(2)]
    try:
        run_id, token = await suspended(engines[0], notifier)
        shown = await engines[0].preview_approval(token, "dana", {"item": "e"})

        async def one(i: int) -> ApprovalResult | AlreadyResumed:
            engine = engines[i % 2]
            try:
                if i % 3 == 0:
                    return await engine.resume_after_confirmation(
                        token, "decline", "dana", reason=f"no ({i})"
                    )
                if i % 3 == 1:
                    return await engine.resume_after_confirmation(
                        token,
                        "approve",
                        "boss",
                        arguments={"item": "e"},
                        digest=shown.digest,
                        reason=f"edit ({i})",
                    )
                return await engine.resume_after_confirmation(token, "approve", "dana")
            except AlreadyResumed as exc:
                return exc

        answers = await asyncio.gather(*(one(i) for i in range(20)))
        won = [a for a in answers if isinstance(a, ApprovalResult)]
        lost = [a for a in answers if isinstance(a, AlreadyResumed)]
        assert len(won) == 1 and len(lost) == 19
        winner = lost[0].details["decision"]
        assert all(a.details["decision"] == winner for a in lost)
        assert winner["decision"] == won[0].decision.value
        if winner["decision"] == "decline":
            assert winner["reason"].startswith("no (") and downstream.effects() == []
        elif winner["arguments"] is not None:
            assert winner["reason"].startswith("edit (") and winner["by"] == "boss"
            assert [item for _, _, item in downstream.effects()] == ["e"]
        else:
            assert winner["reason"] is None
            assert [item for _, _, item in downstream.effects()] == ["b"]
        decided = [e for e in await engines[0].events(run_id) if e.kind in ("approved", "declined")]
        assert len(decided) == 1
    finally:
        for engine in engines:
            engine.close()


# -- conditional confirmation ---------------------------------------------------------------


class PayArgs(BaseModel):
    amount: int


def _large(args: Any, scope: Scope) -> bool:
    return bool(args.amount > 1000)


def _pay_preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"amount": args.amount}


@tool(effect="write", dedupes=True, needs_confirmation=_large, preview=_pay_preview)
def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Pay an amount; a human confirms large ones."""
    return downstream.write_effect(ctx, "pay", str(amount))


def pay_engine(url: str, amounts: list[int], notifier: MemoryNotifier) -> Engine:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("pay", amount=amount)]} for amount in amounts
    ]
    agent = Agent(name="payer", system_prompt="Pay.", tools=(pay,), resolve_scope=agents.resolve)
    return Engine(
        agent=agent,
        model=ScriptedModel([*turns, {"content": "paid"}]),
        settings=Settings(database_url=url),
        notifier=notifier,
    )


async def test_a_confirmation_may_depend_on_the_call_and_is_asked_each_time(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = pay_engine(db_url, [10, 5000], notifier)
    try:
        outcome = await engine.ask("dana", "pay")
        # The small payment ran at once; the large one waits for a human.
        assert outcome.kind is StopKind.SUSPENDED
        assert [item for _, tool_name, item in downstream.effects() if tool_name == "pay"] == ["10"]
        notice = notifier.last(outcome.run_id)
        assert notice.arguments == {"amount": 5000}
        # Edited down below the threshold, on the digest of the edit's preview: it runs.
        shown = await engine.preview_approval(notice.token, "dana", {"amount": 900})
        await engine.resume_after_confirmation(
            notice.token, "approve", "dana", arguments={"amount": 900}, digest=shown.digest
        )
        assert (await engine.run_until_stop(outcome.run_id)).kind is StopKind.ANSWERED
        assert [item for _, _, item in downstream.effects()] == ["10", "900"]
    finally:
        engine.close()


# -- finding and deciding requests by run (reference §6, §15) ---------------------------------


async def test_one_users_many_requests_never_hide_anothers_and_the_inbox_says_how_many_more(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, _ = sending
    danas = [(await engine.ask("dana", "send b")).run_id for _ in range(3)]
    mine = (await engine.ask("miguel", "send b")).run_id  # expires last of all
    page = await engine.pending_approvals("miguel", limit=2)
    assert [run.id for run in page] == [mine] and len(page) == 1 and page.more == 0
    first = await engine.pending_approvals("dana", limit=2)
    assert [run.id for run in first] == danas[:2] and first.more == 1
    assert first.after is not None and first.after.endswith(":" + danas[1])
    rest = await engine.pending_approvals("dana", limit=2, after=first.after)
    assert [run.id for run in rest] == danas[2:] and rest.more == 0 and rest.after is None
    everything = await engine.pending_approvals("boss", limit=3)  # boss approves for all
    assert [run.id for run in everything] == [*danas, mine][:3] and everything.more == 1
    operator = await engine.operator.pending_approvals(limit=10)
    assert [run.id for run in operator] == [*danas, mine] and operator.more == 0
    with pytest.raises(InvalidInput):
        await engine.pending_approvals("dana", limit=0)
    with pytest.raises(InvalidInput):
        await engine.pending_approvals("dana", after="-1")


async def test_deciding_by_run_and_call_id_executes_once_and_answers_as_its_token_would(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    pending = (await engine.get_run(run_id)).run.pending
    assert pending is not None
    (done,) = await engine.decide_calls(
        run_id, "boss", [{"tool_call_id": pending.tool_call_id, "decision": "approve"}]
    )
    assert done.to_json() == {
        "tool_call_id": pending.tool_call_id,
        "ok": True,
        "run_id": run_id,
        "decision": "approve",
        "state": "running",
        "outcome": "executed",
    }
    (again,) = await engine.decide_calls(
        run_id, "dana", [{"tool_call_id": pending.tool_call_id, "decision": "decline"}]
    )
    assert again.to_json()["outcome"] == "already_resumed" and again.refused is not None
    assert again.refused.details["decision"]["by"] == "boss"
    with pytest.raises(AlreadyResumed):
        await engine.resume_after_confirmation(token, "approve", "dana")
    assert [item for _, _, item in downstream.effects()] == ["b"]


async def test_a_bad_entry_among_decisions_by_run_records_none_and_strangers_find_nothing(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    pending = (await engine.get_run(run_id)).run.pending
    assert pending is not None
    call = pending.tool_call_id
    ok = {"tool_call_id": call, "decision": "approve"}
    for bad in (
        [ok, ok],  # repeated
        [{"tool_call_id": "call_nope", "decision": "approve"}],  # unknown
        [{"tool_call_id": call, "decision": "maybe"}],
        [{"tool_call_id": call, "decision": "approve", "arguments": {"item": 7}}],
        [{"tool_call_id": call, "decision": "decline", "arguments": {"item": "c"}}],
        [{"tool_call_id": call, "decision": "approve", "digest": "not-hex"}],
        [{"tool_call_id": call, "decision": "approve", "surprise": 1}],
        [{"decision": "approve"}],
        [],
    ):
        with pytest.raises(InvalidInput):
            await engine.decide_calls(run_id, "dana", bad)
    with pytest.raises(NotFound):
        await engine.decide_calls(run_id, "miguel", [ok])  # may not approve dana's runs
    with pytest.raises(NotFound):
        await engine.decide_calls("run_missing", "dana", [ok])
    assert (await engine.get_run(run_id)).run.state is RunState.SUSPENDED
    assert downstream.effects() == []
    result = await engine.resume_after_confirmation(token, "approve", "dana")  # still works
    assert result.outcome.value == "executed"


async def test_a_stale_digest_by_run_is_changed_with_a_new_token_inside_its_result(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, _ = await suspended(engine, notifier)
    pending = (await engine.get_run(run_id)).run.pending
    assert pending is not None
    (answer,) = await engine.decide_calls(
        run_id,
        "dana",
        [{"tool_call_id": pending.tool_call_id, "decision": "approve", "digest": "0" * 64}],
    )
    body = answer.to_json()
    assert body["outcome"] == body["error"] == "changed" and body["ok"] is False
    assert body["token"] == notifier.last(run_id).token
    assert downstream.effects() == []


async def test_an_edit_without_a_digest_says_so_suspends_on_the_edit_and_records_no_approval(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    with pytest.raises(Changed) as changed:
        await engine.resume_after_confirmation(token, "approve", "dana", arguments={"item": "c"})
    assert "digest" in changed.value.message and "missing" in changed.value.message
    assert "POST /v1/approvals/{token}/preview" in changed.value.message
    assert "tether approvals preview TOKEN --arguments" in changed.value.message
    assert changed.value.details["diff"] == [{"path": "item", "before": "b", "after": "c"}]
    again = (await engine.get_run(run_id)).run
    assert again.state is RunState.SUSPENDED and again.pending is not None
    assert again.pending.arguments == {"item": "c"} and again.pending.edited_from == {"item": "b"}
    # Nothing records it as approved: no approved decision, event or ledger edit.
    kinds = [e.kind for e in await engine.events(run_id)]
    assert "approved" not in kinds and kinds[-1] == "suspended"
    decision = await asyncio.to_thread(
        engine.runner.store.decision_for_call, run_id, again.pending.tool_call_id
    )
    assert decision is not None and decision.decision != "approve"
    (entry,) = [e for e in await engine.ledger(run_id) if e.tool == "send"]
    assert entry.edited_arguments is None and entry.status is CallStatus.INTENT
    # The old token says what happened to it; the new one's preview gives the digest.
    with pytest.raises(AlreadyResumed):
        await engine.resume_after_confirmation(token, "approve", "dana")
    new_token = changed.value.details["token"]
    shown = await engine.preview_approval(new_token, "dana")
    result = await engine.resume_after_confirmation(
        new_token, "approve", "dana", digest=shown.digest
    )
    assert result.outcome.value == "executed"
    assert [item for _, _, item in downstream.effects()] == ["c"]


async def test_an_edit_equal_to_the_pending_arguments_is_a_plain_approval(
    sending: tuple[Engine, MemoryNotifier],
) -> None:
    engine, notifier = sending
    run_id, token = await suspended(engine, notifier)
    result = await engine.resume_after_confirmation(
        token, "approve", "dana", arguments={"item": "b"}
    )
    assert result.outcome.value == "executed"
    (approved,) = [e.data for e in await engine.events(run_id) if e.kind == "approved"]
    assert "arguments_to" not in approved  # nothing was edited
    (entry,) = [e for e in await engine.ledger(run_id) if e.tool == "send"]
    assert entry.edited_arguments is None
    await engine.run_until_stop(run_id)
    assert "edited_by_user" not in results((await engine.get_run(run_id)).messages)[-1]
