"""Flow control (reference §13) on both backends: claims by priority then age, runs that
wait for their start time, and at most ``TETHER_MAX_ACTIVE_PER_USER`` runs of a user
carried at once, with the users behind nobody's backlog; through the store, the API and
the Python API."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import inprocess
import pytest
from json_api import DANA, MIGUEL, fingerprint, refused, samples, serving
from store_runs import claim_ids, new_run, stored_load, true_load
from waiting import until

from tether import Engine, StopKind
from tether.errors import InvalidInput
from tether.runs import RunState
from tether.store import Store
from tether.store.sql.schema import runs
from tether.worker import Worker


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store(db_url)
    yield opened
    opened.close()


# -- priority and age -------------------------------------------------------------------------


def test_workers_claim_the_highest_priority_first_then_the_oldest(store: Store) -> None:
    low = new_run(store, priority=-3)
    first = new_run(store)
    high = new_run(store, priority=5)
    second = new_run(store)
    assert claim_ids(store, 5) == [high, first, second, low, None]


def test_a_queued_follow_up_and_a_due_start_are_claimed_in_priority_order(store: Store) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).timestamp()
    ready = new_run(store)
    due = new_run(store, priority=2, start_at=past)  # a past start: ready at once, by priority
    assert claim_ids(store, 3) == [due, ready, None]


# -- start times --------------------------------------------------------------------------------


def test_a_run_waits_queued_until_its_start_time_by_the_databases_clock(store: Store) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).timestamp()
    run_id = new_run(store, start_at=later)
    run = store.get_run(run_id)
    assert run is not None and run.state is RunState.QUEUED and run.start_at == later
    assert store.claim_ready("w1") is None and store.claim_ready("w1", run_id) is None
    with store.begin() as conn:  # its time comes (as if an hour passed)
        conn.execute(runs.update().where(runs.c.id == run_id).values(start_at=1.0))
    claimed = store.claim_ready("w1")
    assert claimed is not None and claimed.id == run_id and claimed.state is RunState.RUNNING


def test_a_start_time_past_already_starts_the_run_at_once(store: Store) -> None:
    run_id = new_run(store, start_at=1.0)
    run = store.get_run(run_id)
    assert run is not None and run.state is RunState.RUNNING
    assert claim_ids(store, 1) == [run_id]


# -- the per-user cap ---------------------------------------------------------------------------


def test_the_cap_holds_a_users_runs_back_and_claims_others_past_them(store: Store) -> None:
    backlog = [new_run(store, "ana") for _ in range(5)]
    late = new_run(store, "bo")  # arrives last, behind ana's whole backlog
    assert claim_ids(store, 4, cap=2) == [backlog[0], late, backlog[1], None]
    assert stored_load(store)["ana"] == (2, 3)
    assert store.cancel(run_id=backlog[0], user_id="ana", by="ana") is not None
    assert claim_ids(store, 2, cap=2) == [backlog[2], None]  # the slot freed: ana's next
    assert claim_ids(store, 1) == [backlog[3]]  # without a cap nothing holds it back
    assert stored_load(store) == true_load(store)


def test_among_equal_priorities_the_user_with_fewer_runs_carried_goes_first(
    store: Store,
) -> None:
    ana = [new_run(store, "ana") for _ in range(3)]
    bo = new_run(store, "bo")
    urgent = new_run(store, "ana", priority=1)
    # urgent first (its priority); then ana carries one and bo none: bo's goes before
    # ana's older ones.
    assert claim_ids(store, 3, cap=5) == [urgent, bo, ana[0]]


def test_a_given_run_of_a_user_at_the_cap_is_not_claimed(store: Store) -> None:
    first, second = new_run(store, "ana"), new_run(store, "ana")
    assert store.claim_ready("w1", first, cap=1) is not None
    assert store.claim_ready("w2", second, cap=1) is None
    assert store.claim_ready("w2", second, cap=2) is not None


def test_the_user_counts_follow_every_change_of_state_and_owner(store: Store) -> None:
    ids = [new_run(store, user) for user in ("ana", "ana", "bo", "bo", "cy")]
    claim_ids(store, 3)
    assert stored_load(store) == true_load(store)
    claimed = [r for r in (store.get_run(i) for i in ids) if r is not None and r.owner]
    store.release(claimed[0].lease(), elapsed_ms=0)  # handed back: ready again
    store.cancel(run_id=claimed[1].id, user_id=claimed[1].user_id, by="x")
    assert stored_load(store) == true_load(store)
    with store.begin() as conn:
        conn.execute(runs.delete().where(runs.c.id == ids[-1]))
    assert stored_load(store) == true_load(store)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_concurrent_claims_never_carry_more_than_the_cap_of_a_user(store: Store) -> None:
    for _ in range(12):
        new_run(store, "ana")
    for _ in range(4):
        new_run(store, "bo")
    start = threading.Barrier(8)
    taken: list[str] = []

    def claimer(worker: int) -> None:
        start.wait()
        for _ in range(4):
            run = store.claim_ready(f"w{worker}", cap=3)
            if run is not None:
                taken.append(run.user_id)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == ["ana"] * 3 + ["bo"] * 3
    assert stored_load(store) == true_load(store) == {"ana": (3, 9), "bo": (3, 1)}


# -- through the API ----------------------------------------------------------------------------


async def test_the_api_takes_priority_and_start_at_and_shows_them(db_url: str) -> None:
    async with serving(db_url) as api:
        later = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
        stamp = later.astimezone(UTC).isoformat().replace("+00:00", "+01:00")
        waiting = await api.start(priority=-2, start_at=stamp)
        body = await api.run(waiting)
        assert body["state"] == "queued" and body["priority"] == -2
        assert datetime.fromisoformat(body["start_at"]) == later - timedelta(hours=1)
        asked = await api.start()
        plain = await api.run(asked)
        assert (plain["priority"], plain["start_at"], plain["schedule_id"]) == (0, None, None)
        assert plain["state"] == "running"


@pytest.mark.parametrize(
    "bad",
    [
        {"priority": "1"},
        {"priority": 1.0},
        {"priority": True},
        {"priority": 11},
        {"priority": -11},
        {"start_at": "2030-01-01T09:00:00"},  # no UTC offset
        {"start_at": "next monday"},
        {"start_at": 1893456000},
        {"start_at": "0001-01-01T00:00:00+00:01"},  # well formed, but in year 0 in UTC
        {"start_at": "9999-12-31T23:59:59-14:00"},  # in year 10000 in UTC
    ],
)
async def test_a_bad_priority_or_start_time_is_invalid_input_and_stores_nothing(
    db_url: str, bad: dict[str, Any]
) -> None:
    async with serving(db_url) as api:
        before = await fingerprint(api.engine)
        response = await api.client.post("/v1/runs", json={"question": "q", **bad}, headers=DANA)
        refused(response, 422, "invalid_input")
        assert await fingerprint(api.engine) == before


async def test_the_python_api_validates_priority_and_start_at(db_url: str) -> None:
    async with serving(db_url) as api:
        await api.engine.operator.set_user("dana", max_priority=3)
        with pytest.raises(InvalidInput, match="priority"):
            await api.engine.start_run("dana", "q", priority=20)
        with pytest.raises(InvalidInput, match="UTC offset"):
            await api.engine.start_run("dana", "q", start_at=datetime(2030, 1, 1))
        run = await api.engine.start_run(
            "dana", "q", priority=3, start_at=datetime.now(UTC) + timedelta(days=1)
        )
        assert run.state is RunState.QUEUED and run.priority == 3


async def test_an_approval_past_the_cap_is_recorded_and_carried_once_a_slot_frees(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        blocker = await api.start(MIGUEL)  # another user's run does not count against dana's
        dana_other = await api.start()
        settings = api.engine.runner.services.settings
        object.__setattr__(settings, "max_active_per_user", 1)
        store = api.engine.runner.store
        assert store.claim_ready("elsewhere", dana_other, cap=1) is not None  # dana at cap
        response = await api.decide(token)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert (answer["outcome"], answer["waiting_for"], answer["state"]) == (
            "recorded",
            0,
            "running",
        )
        run = store.get_run(run_id)
        assert run is not None and (run.state, run.owner) == (RunState.RUNNING, None)
        assert store.claim_ready("w", cap=1) is not None  # miguel's, never dana's
        assert store.claim_ready("w", cap=1) is None
        held = store.get_run(dana_other)
        assert held is not None
        store.release(held.lease(), elapsed_ms=0)
        store.cancel(run_id=dana_other, user_id="dana", by="dana")
        outcome = await api.engine.run_until_stop(run_id)  # carries the decision out
        assert outcome.kind is StopKind.ANSWERED
        kinds = [e.kind for e in await api.engine.events(run_id)]
        assert kinds.count("approved") == 1 and "tool_result" in kinds
        assert store.get_run(blocker).owner == "w"  # type: ignore[union-attr]


async def test_metrics_count_the_waiting_runs_by_why(db_url: str) -> None:
    async with serving(db_url) as api:
        settings = api.engine.runner.services.settings
        object.__setattr__(settings, "max_active_per_user", 1)
        later = datetime.now(UTC) + timedelta(hours=1)
        await api.start(start_at=later.isoformat())
        first, _ = await api.suspended()
        thread = (await api.run(first))["thread_id"]
        await api.start(thread_id=thread, if_busy="enqueue")
        carried, held = await api.start(MIGUEL), await api.start(MIGUEL)
        assert api.engine.runner.store.claim_ready("w", carried, cap=1) is not None
        text = (await api.client.get("/metrics")).text
        waiting = samples(text, "tether_runs_waiting")
        assert waiting[(("reason", "start_time"),)] == 1
        assert waiting[(("reason", "thread"),)] == 1
        assert waiting[(("reason", "user_cap"),)] == 1  # miguel's second, behind his first
        assert waiting[(("reason", "rate_limit"),)] == 0
        assert held


async def test_an_idle_worker_starts_a_run_when_its_start_time_comes_not_at_its_poll(
    db_url: str,
) -> None:
    engine = inprocess.tiny_engine(db_url)
    try:
        soon = datetime.now(UTC) + timedelta(seconds=1.5)
        run = await engine.start_run("dana", "q", start_at=soon)
        assert run.state is RunState.QUEUED
        worker = Worker(engine, concurrency=2, poll_s=120.0)  # only the start time wakes it
        task = asyncio.create_task(worker.run(reap=False))
        try:
            answered = await until(
                lambda: _state_is(engine, run.id, RunState.ANSWERED), timeout=30, what="answer"
            )
            assert answered
        finally:
            worker.stop()
            await task
        events = await engine.events(run.id)
        claimed = next(e for e in events if e.kind not in ("created",))
        assert claimed.at >= soon.timestamp() - 0.05  # not before its time (database clock)
    finally:
        engine.close()


async def _state_is(engine: Engine, run_id: str, state: RunState) -> bool:
    return bool((await engine.get_run(run_id)).run.state is state)
