"""Removing a user (reference §6) on both backends: one transaction that cancels their
queued, running and suspended runs (each with a ``cancelled`` event saying why), deletes
their schedules, revokes their keys and keeps their halted and finished runs; nothing of
theirs is claimed, approved, continued, forked or started afterwards, and their name
stays taken. A worker carrying one of their runs is fenced (in processes:
``tests/acceptance/test_removed_user.py``)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import inprocess
import pytest
import sqlalchemy as sa
from store_runs import new_run

from tether import Engine, MemoryNotifier, StopKind
from tether.errors import InvalidInput, LeaseLost, NotFound, UnknownOrExpired
from tether.runs import Lease, RunState
from tether.store import Store
from tether.store.sql.schema import runs, schedules
from tether.store.users import add_user

# A schedule whose next tick never comes due while a test watches (unless it is moved).
YEARLY = "0 0 1 1 *"


@dataclass
class Ana:
    """ana's runs in every state a removal meets, and bo's, who stays."""

    engine: Engine
    notifier: MemoryNotifier
    suspended: str
    token: str
    ready: str
    carried: Lease
    queued: str
    delayed: str
    halted: str
    answered: str
    schedule: str
    bos_run: str
    bos_schedule: str

    @property
    def active(self) -> set[str]:
        return {self.suspended, self.ready, self.carried.run_id, self.queued, self.delayed}


@pytest.fixture
async def ana(db_url: str) -> AsyncIterator[Ana]:
    notifier = MemoryNotifier()
    engine = inprocess.fault_engine(db_url, notifier=notifier)
    for user in ("ana", "bo"):
        await engine.operator.add_user(user)
    suspended = await engine.ask("ana", "script:send pay it")
    assert suspended.kind is StopKind.SUSPENDED
    halted = await engine.ask("ana", "script:work", limits={"max_steps": 1})
    answered = await engine.ask("ana", "script:answer")
    assert (halted.kind, answered.kind) == (StopKind.HALTED, StopKind.ANSWERED)
    ready = await engine.start_run("ana", "script:answer")
    carried = engine.runner.store.claim_ready(
        "another-worker", (await engine.start_run("ana", "q")).id
    )
    assert carried is not None
    thread = (await engine.get_run(suspended.run_id)).run.thread_id
    queued = await engine.start_run("ana", "then", thread_id=thread, if_busy="enqueue")
    later = datetime.now(UTC) + timedelta(days=1)
    delayed = await engine.start_run("ana", "script:answer", start_at=later)
    assert (queued.state, delayed.state) == (RunState.QUEUED, RunState.QUEUED)
    bos = await engine.start_run("bo", "script:answer")
    yield Ana(
        engine=engine,
        notifier=notifier,
        suspended=suspended.run_id,
        token=notifier.last(suspended.run_id).token,
        ready=ready.id,
        carried=carried.lease(),
        queued=queued.id,
        delayed=delayed.id,
        halted=halted.run_id,
        answered=answered.run_id,
        schedule=(await engine.add_schedule("ana", YEARLY, "pay the invoice")).id,
        bos_run=bos.id,
        bos_schedule=(await engine.add_schedule("bo", YEARLY, "report")).id,
    )
    engine.close()


async def test_removing_a_user_cancels_their_active_runs_and_keeps_their_stopped_ones(
    ana: Ana,
) -> None:
    engine = ana.engine
    removal = await engine.operator.remove_user("ana")
    assert set(removal.runs_cancelled) == ana.active
    assert (removal.keys_revoked, removal.schedules_deleted) == (1, 1)
    for run_id in ana.active:
        assert (await engine.get_run(run_id)).run.state is RunState.CANCELLED
        last = (await engine.events(run_id))[-1]
        assert last.kind == "cancelled" and last.data["reason"] == "user_removed"
    states = {r.id: r.state for r in await engine.list_runs("ana")}
    assert states[ana.halted] is RunState.HALTED  # kept for their retention
    assert states[ana.answered] is RunState.ANSWERED
    assert [s.id for s in await engine.list_schedules()] == [ana.bos_schedule]
    assert (await engine.get_run(ana.bos_run)).run.state is RunState.RUNNING
    # The worker that carried one is fenced: its lease is gone and its next write refused.
    assert engine.runner.store.lease_held(ana.carried) is False
    with pytest.raises(LeaseLost):
        engine.runner.store.add_event(ana.carried, "model_turn", {"step": 1})


async def test_nothing_of_a_removed_user_is_claimed_approved_continued_or_started(
    ana: Ana,
) -> None:
    engine = ana.engine
    store = engine.runner.store
    due = store.now() - 1
    with store.begin() as conn:  # both schedules due: only bo's may fire
        conn.execute(schedules.update().values(next_at=due))
    await engine.operator.remove_user("ana")
    assert (await engine.runner.fire_schedules())[0] == 1
    claimed = []
    while (run := store.claim_ready("a-worker")) is not None:
        claimed.append(run.user_id)
    assert claimed == ["bo", "bo"]  # bo's run and the run of bo's schedule
    for who in ("ana", "boss"):  # the owner, and an approver in ana's scope
        with pytest.raises(UnknownOrExpired):
            await engine.resume_after_confirmation(ana.token, "approve", who)
    refusals = [
        engine.continue_run(ana.halted, "ana"),
        engine.fork_run(ana.answered, "ana", at_step=1),
        engine.start_run("ana", "q"),
        engine.add_schedule("ana", YEARLY, "again"),
    ]
    for refusal in refusals:
        with pytest.raises(InvalidInput, match="removed"):
            await refusal
    with pytest.raises(InvalidInput, match="tether users erase ana"):
        await engine.operator.add_user("ana")
    assert (await engine.get_run(ana.halted)).run.state is RunState.HALTED
    assert len(await engine.list_runs("ana")) == 7  # nothing new
    with pytest.raises(NotFound):
        await engine.operator.remove_user("ana")


def test_runs_created_while_their_user_is_removed_end_cancelled_or_refused(db_url: str) -> None:
    store = Store(db_url)
    add_user(store, "ana")
    start = threading.Barrier(4)
    created: list[str] = []
    refused: list[str] = []

    def creator() -> None:
        start.wait()
        for _ in range(15):
            try:
                created.append(new_run(store, "ana"))
            except InvalidInput as exc:
                refused.append(str(exc))

    def remover() -> None:
        start.wait()
        store.remove_user("ana")

    threads = [threading.Thread(target=creator) for _ in range(3)]
    threads.append(threading.Thread(target=remover))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with store.engine.connect() as conn:
        states = {
            str(i): str(state) for i, state in conn.execute(sa.select(runs.c.id, runs.c.state))
        }
    assert sorted(states) == sorted(created) and len(created) + len(refused) == 45
    assert all(state == "cancelled" for state in states.values()), states
    assert all("removed" in message for message in refused)
    store.close()
