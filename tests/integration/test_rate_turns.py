"""The fleet's model capacity given to users in turn (reference §13), on both backends: when
runs of several users wait, what frees goes to the user who used least of the window
first, across limiters (each engine's, as each process has its own), and request starts
are spread over the window, so one user's looping run cannot hold another's for a whole
window. Assertions are on which user was granted what, in which order, and on waits the
store computed on the database's clock; none on how long something took."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from waiting import until

from tether import Agent, Engine, MemoryNotifier, StopKind, tool
from tether.config import Settings
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.store import Grant, Store
from tether.store.sql.schema import model_usage, model_waits

WINDOW_S = 60.0  # the store's tests never wait for it
VALID_S = 1.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store(db_url)
    yield opened
    opened.close()


def lease(store: Store, waiter: str, **wants: int) -> Grant:
    return store.lease_capacity(
        wants=wants, rpm=4, tpm=None, window_s=WINDOW_S, valid_s=VALID_S, waiter=waiter
    )


def used(store: Store, user: str, requests: int, ago: float) -> None:
    """``user`` leased ``requests`` starts ``ago`` seconds before the database's now."""
    at = store.now() - ago
    with store.engine.begin() as conn:
        conn.execute(model_usage.insert().values(at=at, requests=requests, user_id=user))


def age(store: Store, by: float) -> None:
    """Every lease so far as if made ``by`` seconds earlier."""
    with store.engine.begin() as conn:
        conn.execute(model_usage.update().values(at=model_usage.c.at - by))


def test_what_frees_goes_to_the_waiting_user_who_used_least(store: Store) -> None:
    used(store, "ana", 4, ago=30)  # RPM 4: the window is full, all of it ana's
    assert lease(store, "y", bo=1).total == 0  # bo's runs wait, in another process
    assert lease(store, "x", ana=1).total == 0
    age(store, by=WINDOW_S)  # ana's four leave the window...
    used(store, "ana", 2, ago=30)  # ...but she used two more since: two are free
    # The spread lets one start now (RPM 4: one in a quarter of the window); it is bo's,
    # though ana's runs asked first here: bo used none of the window, ana two.
    held = lease(store, "x", ana=1)
    assert held.granted == {"ana": 0} and held.next_at is not None and held.next_at > held.at
    assert lease(store, "y", bo=1).granted == {"bo": 1}
    assert lease(store, "x", ana=1).total == 0  # the spread's part is used: bo's start


def test_one_lease_for_several_users_gives_each_one_before_any_two(store: Store) -> None:
    grant = store.lease_capacity(
        wants={"ana": 3, "bo": 3, "cy": 1}, rpm=30, tpm=None, window_s=WINDOW_S, valid_s=VALID_S
    )  # RPM 30: the spread lets 3 start at once
    assert grant.granted == {"ana": 1, "bo": 1, "cy": 1}
    assert set(grant.rows) == {"ana", "bo", "cy"}


def test_among_equal_use_the_user_waiting_longest_goes_first(store: Store) -> None:
    used(store, "ana", 1, ago=30)
    used(store, "bo", 1, ago=30)
    used(store, "cy", 1, ago=0)  # the spread's part (a quarter of the window) is used
    assert lease(store, "x", bo=1).total == 0  # bo waits first, then ana
    assert lease(store, "y", ana=1).total == 0
    age(store, by=20)  # the spread's part frees (one start)
    assert lease(store, "y", ana=1).total == 0  # bo's turn: waiting longer, same use
    assert lease(store, "x", bo=1).total == 1


def test_a_waiting_user_whose_limiter_never_comes_back_stops_being_owed(store: Store) -> None:
    used(store, "ana", 2, ago=30)
    now = store.now()
    with store.engine.begin() as conn:  # bo's runs waited in a process that died
        row = {"waiter": "dead", "user_id": "bo", "wanting": 1, "since": 0.0}
        conn.execute(model_waits.insert().values(**row, until=now + 3600))
    assert lease(store, "x", ana=1).total == 0  # owed to bo while the row holds
    with store.engine.begin() as conn:
        conn.execute(model_waits.update().values(until=now - 1))
    assert lease(store, "x", ana=1).total == 1
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(model_waits)).all() == []  # lapsed, and struck


def test_a_limiter_that_got_what_it_asked_strikes_its_waiting_users(store: Store) -> None:
    used(store, "ana", 4, ago=30)
    assert lease(store, "x", ana=2).total == 0
    with store.engine.connect() as conn:
        wanted = conn.execute(sa.select(model_waits.c.user_id, model_waits.c.wanting)).all()
    assert [tuple(row) for row in wanted] == [("ana", 2)]
    age(store, by=WINDOW_S)
    assert lease(store, "x", ana=1).total == 1
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(model_waits)).all() == []


# -- engines: a looping run of one user and a one-step run of another ------------------------


@tool
def peek(n: int) -> dict[str, int]:
    """A read."""
    return {"n": n}


class Looping(Model):
    """``loop`` asks for ``peek`` turn after turn; any other question is answered at once.
    Records each request's question, in the order they came."""

    name = "looping"

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        question = str(messages[1].get("content"))
        self.asked.append(question)
        turns = sum(1 for m in messages if m.get("role") == "assistant")
        if question == "loop":
            function = {"name": "peek", "arguments": json.dumps({"n": turns})}
            call = {"id": f"c{turns}", "type": "function", "function": function}
            message: Message = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": "done"}
        return ModelResponse(message=message, usage=Usage(input_tokens=1), model="looping")


# RPM 8 over 4 s: the spread lets one start each half second (and the window counts each
# start over 5 s, with the slots' second of validity).
LOOP_WINDOW_S = 4.0
LOOP_RPM = 8


@pytest.fixture
async def engines(db_url: str) -> AsyncIterator[tuple[list[str], list[Engine]]]:
    asked: list[str] = []
    agent = Agent(name="loop", system_prompt="Peek.", tools=(peek,))
    made: list[Engine] = []
    for _ in range(2):
        settings = Settings(
            database_url=db_url, model_rpm=LOOP_RPM, model_rate_window_s=LOOP_WINDOW_S
        )
        model = Looping(asked)
        made.append(Engine(agent=agent, model=model, settings=settings, notifier=MemoryNotifier()))
    yield asked, made
    for engine in made:
        await engine.aclose()


async def _began_to_wait(engine: Engine, run_id: str, asked: list[str]) -> int:
    """Once the run's one request was asked, or it began to wait for capacity: how many of
    the looping run's requests had come by then."""

    async def waiting() -> bool:
        kinds = {e.kind for e in await engine.events(run_id)}
        return "once" in asked or "rate_limited" in kinds

    await until(waiting, timeout=60, what="bo's run to ask or to wait")
    return asked.count("loop") if "once" not in asked else asked.index("once")


@pytest.mark.parametrize("processes", [1, 2])
async def test_a_looping_run_does_not_hold_another_users_run(
    engines: tuple[list[str], list[Engine]], processes: int
) -> None:
    asked, (first, second) = engines
    other = second if processes == 2 else first
    limits: dict[str, Any] = {"max_steps": 200, "max_tool_calls": 200}
    looping = await first.start_run("ana", "loop", limits=limits)
    carried = asyncio.create_task(first.run_until_stop(looping.id))
    try:
        await until(lambda: asked.count("loop") >= 3, timeout=60, what="ana's loop to run")
        one_step = await other.start_run("bo", "once")
        answered = asyncio.create_task(other.run_until_stop(one_step.id))
        before = await _began_to_wait(other, one_step.id, asked)
        assert (await answered).kind is StopKind.ANSWERED
    finally:
        carried.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await carried
    # Once bo's run waited, the next request to start was bo's: at most one of ana's, granted
    # before bo's run asked, started in between.
    assert asked[: asked.index("once")].count("loop") - before <= 1, asked
    # Its wait, as the store computed it on the database's clock, was the spread's part of
    # the window and a slot's validity at most, never a whole window.
    for event in await other.events(one_step.id):
        if event.kind == "rate_limited":
            assert event.data["wait_s"] < LOOP_WINDOW_S / 2, event.data
