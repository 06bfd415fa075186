"""Schedules (reference §13) on both backends: the API (add, list, delete, another user's
404, bad input 422 with nothing stored), each tick firing exactly one run however many
workers race for it, one catch-up run after downtime with the missed ticks counted, and
the worker's side task firing a due tick on its own."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import inprocess
import pytest
import sqlalchemy as sa
from json_api import DANA, MIGUEL, refused, serving
from waiting import until

from tether import Engine
from tether.store.sql.schema import runs, schedules
from tether.worker import Worker

# Once a tick fires, the schedule's next tick must not come due while a test still
# watches: a minute's cron would fire again whenever a test straddles a minute's start.
YEARLY = "0 0 1 1 *"


def _past(
    engine: Engine, schedule_id: str, seconds_ago: float, *, whole_minute: bool = False
) -> None:
    """Make the schedule's tick due ``seconds_ago`` (as if no worker ran meanwhile), from
    the start of the current minute if ``whole_minute`` (so the ticks since are counted
    the same whatever the second the test runs at)."""
    store = engine.runner.store
    now = store.now()
    base = now // 60 * 60 if whole_minute else now
    with store.begin() as conn:
        conn.execute(
            schedules.update()
            .where(schedules.c.id == schedule_id)
            .values(next_at=base - seconds_ago)
        )


def _runs_of(engine: Engine, schedule_id: str) -> list[Any]:
    with engine.runner.store.engine.connect() as conn:
        return list(conn.execute(sa.select(runs).where(runs.c.schedule_id == schedule_id)))


async def test_a_schedule_is_added_listed_and_deleted_by_its_owner_only(db_url: str) -> None:
    async with serving(db_url) as api:
        body = {"cron": "0 9 * * 1", "question": "weekly report", "timezone": "Europe/Paris"}
        created = await api.client.post("/v1/schedules", json=body, headers=DANA)
        assert created.status_code == 201, created.text
        added = created.json()
        assert set(added) == {"id", "next_at"}
        first = datetime.fromisoformat(added["next_at"])
        assert first.astimezone(datetime.now().astimezone().tzinfo) > datetime.now().astimezone()
        listed = (await api.client.get("/v1/schedules", headers=DANA)).json()["items"]
        assert [s["id"] for s in listed] == [added["id"]]
        shown = listed[0]
        assert shown["cron"] == "0 9 * * 1" and shown["timezone"] == "Europe/Paris"
        assert (shown["user_id"], shown["fired"], shown["missed"]) == ("dana", 0, 0)
        assert shown["last_fired_at"] is None and shown["limits"] is None
        assert (await api.client.get("/v1/schedules", headers=MIGUEL)).json()["items"] == []
        theirs = await api.client.delete(f"/v1/schedules/{added['id']}", headers=MIGUEL)
        refused(theirs, 404, "not_found")
        gone = await api.client.delete(f"/v1/schedules/{added['id']}", headers=DANA)
        assert gone.status_code == 204
        again = await api.client.delete(f"/v1/schedules/{added['id']}", headers=DANA)
        refused(again, 404, "not_found")


@pytest.mark.parametrize(
    "bad",
    [
        {"cron": "* * * * * *"},
        {"cron": "61 * * * *"},
        {"cron": "@reboot"},
        {"cron": "0 0 31 2 *"},  # well formed, but February has no 31st: it never fires
        {"cron": "0 0 30 2 *"},
        {"timezone": "Mars/Olympus"},
        {"question": " "},
        {"limits": {"max_steps": 0}},
        {"limits": {"max_steps": 100_000}},  # over the configured cap
        {"cron": 5},
        {"extra": 1},
    ],
)
async def test_a_bad_schedule_is_invalid_input_and_stores_nothing(
    db_url: str, bad: dict[str, Any]
) -> None:
    async with serving(db_url) as api:
        body = {"cron": "@daily", "question": "q", **bad}
        response = await api.client.post("/v1/schedules", json=body, headers=DANA)
        over_cap = bad.get("limits") == {"max_steps": 100_000}  # says which limit, and the cap
        refused(response, 422, "invalid_input", extras=("limit", "cap") if over_cap else ())
        assert await api.engine.list_schedules() == []


async def test_a_due_tick_starts_exactly_one_run_however_many_workers_race(db_url: str) -> None:
    engines = [inprocess.tiny_engine(db_url) for _ in range(3)]
    try:
        added = await engines[0].add_schedule("dana", YEARLY, "tick", limits={"max_steps": 3})
        _past(engines[0], added.id, 1.0)
        fired = await asyncio.gather(*(e.runner.fire_schedules() for e in engines))
        assert sum(count for count, _ in fired) == 1
        (run,) = _runs_of(engines[0], added.id)
        assert (run.user_id, run.question, run.max_steps) == ("dana", "tick", 3)
        view = await engines[1].get_run(run.id)
        assert view.run.schedule_id == added.id
        after = await engines[0].get_schedule(added.id)
        assert (after.fired, after.missed) == (1, 0) and after.last_fired_at is not None
        assert after.next_at > (await engines[0].now())
        assert sum([(await e.runner.fire_schedules())[0] for e in engines]) == 0  # not due
    finally:
        for engine in engines:
            engine.close()


async def test_ticks_missed_while_no_worker_ran_start_one_catch_up_run(db_url: str) -> None:
    engine = inprocess.tiny_engine(db_url)
    try:
        added = await engine.add_schedule("dana", "* * * * *", "catch up")
        _past(engine, added.id, 5 * 60, whole_minute=True)  # five minutes idle: six ticks due
        fired, next_in = await engine.runner.fire_schedules()
        assert fired == 1 and len(_runs_of(engine, added.id)) == 1
        after = await engine.get_schedule(added.id)
        assert (after.fired, after.missed) == (1, 5)
        assert next_in is not None and 0 < next_in <= 60
    finally:
        engine.close()


async def test_a_worker_fires_a_due_tick_and_carries_its_run(db_url: str) -> None:
    engine = inprocess.tiny_engine(db_url, reaper_interval_s=0.5)
    try:
        added = await engine.add_schedule("dana", YEARLY, "from the worker")
        worker = Worker(engine, concurrency=2)
        task = asyncio.create_task(worker.run())
        try:
            _past(engine, added.id, 0.5)
            (run,) = await until(lambda: _runs_of(engine, added.id), timeout=30, what="a run")
            answered = await until(
                lambda: _answered(engine, run.id), timeout=30, what="the tick's run answered"
            )
            assert answered
        finally:
            worker.stop()
            await task
        assert len(_runs_of(engine, added.id)) == 1
    finally:
        engine.close()


async def _answered(engine: Engine, run_id: str) -> bool:
    return (await engine.get_run(run_id)).run.state.value == "answered"
