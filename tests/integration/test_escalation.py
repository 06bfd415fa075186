"""Escalation (reference §19), on both backends: a call still undecided ``escalate_after_min``
after its suspension (by the database's clock) is escalated once, however many passes race
for it: its ``escalated`` event and audit record, a notice ``"escalated": true`` carrying a
token of the call, and from then on the people and groups it names may decide it too
(before, they learn nothing). The owner's approvers and the call's own token keep working.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import deciders
import downstream
import pytest
from waiting import until

from tether import CallVerdict, Engine, MemoryNotifier, StopKind
from tether.config import Settings
from tether.errors import UnknownOrExpired


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[tuple[Engine, MemoryNotifier]]:
    notifier = MemoryNotifier()
    engine = Engine(
        agent=deciders.agent(),
        model=deciders.script("page"),
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    deciders.join("olga", "oncall")
    try:
        yield engine, notifier
    finally:
        engine.close()


async def _escalated(engine: Engine, run_id: str) -> bool:
    await engine.operator.reap()
    return any(e.kind == "escalated" for e in await engine.events(run_id))


async def test_an_undecided_call_is_escalated_once_and_its_people_may_then_decide(
    engine: tuple[Engine, MemoryNotifier],
) -> None:
    eng, notifier = engine
    outcome = await eng.ask(deciders.OWNER, "page them")
    assert outcome.kind is StopKind.SUSPENDED
    assert outcome.notice is not None
    run_id, token = outcome.run_id, outcome.notice.token
    with pytest.raises(UnknownOrExpired):  # not escalated yet: olga learns nothing
        await eng.resume_after_confirmation(token, "approve", "olga")

    await until(lambda: _escalated(eng, run_id), what="the escalation")
    await asyncio.gather(*(eng.operator.reap() for _ in range(3)))  # racing passes
    kinds = [e.kind for e in await eng.events(run_id)]
    assert kinds.count("escalated") == 1
    notice = notifier.last(run_id)
    assert notice.escalated and notice.token != token
    assert set(notice.escalate_to) == {"group:oncall", "lead"}
    shown = (await eng.get_run(run_id)).to_json()["pending_calls"][0]
    assert shown["escalated_at"] is not None and shown["escalated_at"] >= shown["suspended_at"]
    audited = [r for r in await eng.audit(deciders.OWNER) if r.kind == "escalated"]
    assert len(audited) == 1 and audited[0].values["tool"] == "page"

    done = await eng.resume_after_confirmation(notice.token, "approve", "lead")
    assert done.outcome is CallVerdict.EXECUTED and len(downstream.effects()) == 1


async def test_a_member_of_the_escalation_group_decides_with_the_calls_own_token(
    engine: tuple[Engine, MemoryNotifier],
) -> None:
    eng, _ = engine
    outcome = await eng.ask(deciders.OWNER, "page them")
    assert outcome.notice is not None
    await until(lambda: _escalated(eng, outcome.run_id), what="the escalation")
    listed = await eng.pending_approvals("olga")
    assert [r.id for r in listed] == [outcome.run_id]
    assert await eng.pending_approvals("stranger") is not None
    assert list(await eng.pending_approvals("stranger")) == []
    done = await eng.resume_after_confirmation(outcome.notice.token, "approve", "olga")
    assert done.outcome is CallVerdict.EXECUTED


async def test_a_call_decided_in_time_is_never_escalated_and_is_forgotten(
    engine: tuple[Engine, MemoryNotifier],
) -> None:
    eng, notifier = engine
    outcome = await eng.ask(deciders.OWNER, "page them")
    assert outcome.notice is not None
    run = (await eng.get_run(outcome.run_id)).run
    suspended_at = run.pending_calls[0].suspended_at
    assert suspended_at is not None
    done = await eng.resume_after_confirmation(outcome.notice.token, "approve", "dana")
    assert done.outcome is CallVerdict.EXECUTED
    due = suspended_at + deciders.ESCALATE_AFTER_MIN * 60
    store = eng.runner.store
    await until(lambda: _past(eng, due), what="the call's due time")
    assert await asyncio.to_thread(store.next_escalation_in) is None  # nothing a pass escalates
    report = await eng.operator.reap()
    assert report.escalated == []
    assert not [e for e in await eng.events(outcome.run_id) if e.kind == "escalated"]
    assert not [n for n in notifier.notices if n.escalated]
    assert await asyncio.to_thread(store.forget_escalations) == 0  # the pass forgot it


async def _past(eng: Engine, due: float) -> bool:
    return await eng.now() > due
