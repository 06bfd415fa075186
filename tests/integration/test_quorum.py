"""Quorum and groups (reference §19), on both backends, through the Python API: a call that
waits on N distinct approvals of the same artefact is carried out once at the N-th;
approvals before it are recorded and counted; one decline declines; an edit starts a new
round; the same person counts once (``already_decided``); the owner counts unless the
tool says ``approvers="others"`` (``four_eyes``); a group's member may decide while the
directory says so, and not once it no longer does (both scopes resolved now); each
decision and recorded approval leaves its audit record.

No worker runs here: the tests carry runs with ``engine.run_until_stop``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import deciders
import downstream
import pytest

from tether import CallVerdict, Engine, MemoryNotifier, RunState, StopKind
from tether.config import Settings
from tether.errors import AlreadyDecided, AlreadyResumed, FourEyes, UnknownOrExpired

FINANCE = ("ann", "bob", "cat", "dee", "eve")


class Kit:
    def __init__(self, db_url: str, tool: str, amount: int = 500, calls: int = 1) -> None:
        self.notifier = MemoryNotifier()
        self.engine = Engine(
            agent=deciders.agent(),
            model=deciders.script(tool, amount, calls),
            settings=Settings(database_url=db_url),
            notifier=self.notifier,
        )

    async def suspended(self) -> tuple[str, list[str]]:
        outcome = await self.engine.ask(deciders.OWNER, "pay them")
        assert outcome.kind is StopKind.SUSPENDED
        return outcome.run_id, [n.token for n in outcome.notices]

    async def state(self, run_id: str) -> RunState:
        return (await self.engine.get_run(run_id)).run.state


Make = Callable[..., Kit]


@pytest.fixture
async def make(db_url: str) -> AsyncIterator[Make]:
    for person in FINANCE:
        deciders.join(person, "finance")
    kits: list[Kit] = []

    def made(tool: str, amount: int = 500, calls: int = 1) -> Kit:
        kits.append(Kit(db_url, tool, amount, calls))
        return kits[-1]

    try:
        yield made
    finally:
        for kit in kits:
            kit.engine.close()


async def test_two_approvals_carry_the_call_out_once_and_each_is_audited(make: Make) -> None:
    kit = make("pay")
    run_id, [token] = await kit.suspended()
    call = (await kit.engine.get_run(run_id)).run.pending_calls[0]
    assert call.pending.quorum == 2 and kit.notifier.last(run_id).quorum == 2

    first = await kit.engine.resume_after_confirmation(token, "approve", "boss")
    assert first.outcome is CallVerdict.RECORDED
    assert first.to_json()["approvals"] == 1 and first.to_json()["quorum"] == 2
    assert downstream.effects() == []
    shown = (await kit.engine.get_run(run_id)).to_json()["pending_calls"][0]
    assert shown["quorum"] == 2 and [a["by"] for a in shown["approvals"]] == ["boss"]
    assert shown["suspended_at"] is not None and shown["escalated_at"] is None

    with pytest.raises(AlreadyDecided):  # the same person counts once
        await kit.engine.resume_after_confirmation(token, "approve", "boss")

    second = await kit.engine.resume_after_confirmation(token, "approve", "ann")
    assert second.outcome is CallVerdict.EXECUTED
    assert len(downstream.effects()) == 1
    with pytest.raises(AlreadyResumed):  # after the quorum every use is already_resumed
        await kit.engine.resume_after_confirmation(token, "approve", "bob")

    page = await kit.engine.audit("dana")
    kinds = [(r.kind, r.values["by"], r.values["outcome"]) for r in page]
    assert kinds == [("recorded", "boss", "recorded"), ("decided", "ann", "approved")]
    digest = call.pending.digest
    assert all(r.values["digest"] == digest and r.values["tool"] == "pay" for r in page)
    assert [r.seq for r in await kit.engine.audit("ann")] == [page.records[1].seq]


async def test_a_quorum_function_asks_three_over_ten_thousand(make: Make) -> None:
    kit = make("pay", amount=20_000)
    _run_id, [token] = await kit.suspended()
    for n, person in enumerate(("boss", "ann"), start=1):
        answer = await kit.engine.resume_after_confirmation(token, "approve", person)
        assert answer.outcome is CallVerdict.RECORDED and answer.approvals == n
        assert answer.quorum == 3
    third = await kit.engine.resume_after_confirmation(token, "approve", "dana")  # the owner
    assert third.outcome is CallVerdict.EXECUTED and len(downstream.effects()) == 1


async def test_one_decline_declines(make: Make) -> None:
    kit = make("pay")
    _run_id, [token] = await kit.suspended()
    await kit.engine.resume_after_confirmation(token, "approve", "boss")
    declined = await kit.engine.resume_after_confirmation(token, "decline", "ann", reason="no")
    assert declined.outcome is CallVerdict.DECLINED and downstream.effects() == []


async def test_the_owner_never_counts_with_four_eyes(make: Make) -> None:
    kit = make("wire")
    run_id, [token] = await kit.suspended()
    with pytest.raises(FourEyes):
        await kit.engine.resume_after_confirmation(token, "approve", "dana")
    assert (await kit.engine.get_run(run_id)).run.pending_calls[0].approvals == ()
    await kit.engine.resume_after_confirmation(token, "approve", "boss")
    done = await kit.engine.resume_after_confirmation(token, "approve", "ann")
    assert done.outcome is CallVerdict.EXECUTED


async def test_a_member_the_directory_removed_cannot_decide(make: Make) -> None:
    kit = make("pay")
    _run_id, [token] = await kit.suspended()
    await kit.engine.resume_after_confirmation(token, "approve", "ann")  # finance: counts
    deciders.join("bob")  # bob leaves finance before he decides
    with pytest.raises(UnknownOrExpired):
        await kit.engine.resume_after_confirmation(token, "approve", "bob")
    stranger = await kit.engine.audit("bob")
    assert list(stranger) == []  # nothing was recorded of his try
    done = await kit.engine.resume_after_confirmation(token, "approve", "cat")
    assert done.outcome is CallVerdict.EXECUTED


async def test_an_edit_starts_a_new_round_on_the_edited_artefact(make: Make) -> None:
    kit = make("pay")
    run_id, [token] = await kit.suspended()
    await kit.engine.resume_after_confirmation(token, "approve", "boss")
    edit = {"to": "acct-0", "amount": 450}
    shown = await kit.engine.preview_approval(token, "ann", edit)
    started = await kit.engine.resume_after_confirmation(
        token, "approve", "ann", arguments=edit, digest=shown.digest
    )
    assert started.outcome is CallVerdict.RECORDED and started.approvals == 1
    pending = (await kit.engine.get_run(run_id)).run.pending_calls[0]
    assert pending.pending.arguments == edit and pending.pending.digest == shown.digest
    assert [a["by"] for a in pending.approvals] == ["ann"]  # boss's approval no longer counts
    again = await kit.engine.resume_after_confirmation(token, "approve", "boss")
    assert again.outcome is CallVerdict.EXECUTED
    assert [item for _, _, item in downstream.effects()] == ["acct-0:450"]


async def test_racing_approvers_carry_the_call_out_exactly_once(make: Make) -> None:
    kit = make("pay")
    _run_id, [token] = await kit.suspended()
    answers = await asyncio.gather(
        *(kit.engine.resume_after_confirmation(token, "approve", p) for p in FINANCE),
        return_exceptions=True,
    )
    executed = [
        a for a in answers if not isinstance(a, BaseException) and a.outcome.value == "executed"
    ]
    recorded = [
        a for a in answers if not isinstance(a, BaseException) and a.outcome.value == "recorded"
    ]
    late = [a for a in answers if isinstance(a, AlreadyResumed)]
    assert len(executed) == 1 and len(recorded) == 1 and len(late) == 3, answers
    assert len(downstream.effects()) == 1


async def test_the_last_approvals_of_two_calls_of_one_turn_race_and_each_runs_once(
    make: Make,
) -> None:
    kit = make("pay", calls=2)
    run_id, tokens = await kit.suspended()
    for token in tokens:
        await kit.engine.resume_after_confirmation(token, "approve", "boss")
    answers = await asyncio.gather(
        *(kit.engine.resume_after_confirmation(t, "approve", "ann") for t in tokens)
    )
    assert sorted(a.outcome.value for a in answers) in (
        ["executed", "executed"],
        ["executed", "recorded"],
    )
    assert sorted(item for _, _, item in downstream.effects()) == ["acct-0:500", "acct-1:500"]
    assert await kit.state(run_id) is not RunState.SUSPENDED


async def test_decisions_recorded_before_the_last_take_effect_with_it(make: Make) -> None:
    kit = make("page", calls=2)  # two calls of one turn, each decided by one person
    run_id, tokens = await kit.suspended()
    first = await kit.engine.resume_after_confirmation(tokens[0], "approve", "boss")
    assert first.outcome is CallVerdict.RECORDED
    await kit.engine.resume_after_confirmation(tokens[1], "decline", "ann", reason="no")
    page = await kit.engine.audit("dana")
    calls = [n.tool_call_id for n in kit.notifier.notices if n.run_id == run_id]
    shown = [(r.kind, r.values["by"], r.values["outcome"]) for r in page]
    assert shown == [
        ("recorded", "boss", "recorded"),
        ("decided", "boss", "approved"),  # it took effect when the turn's last was decided
        ("decided", "ann", "declined"),
    ]
    assert len(set(calls)) == 2
    assert [r.values["tool_call_id"] for r in page] == [calls[0], *calls]
