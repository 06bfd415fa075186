"""Single flight: concurrent callers of one key share one call's result; a call that
fails or is cancelled is not shared (its followers make the call themselves); results
cross event loops."""

from __future__ import annotations

import asyncio
import threading

import pytest
from waiting import run_sync, until

from tether._runtime.single_flight import InFlight


class Calls:
    """A call that waits until released, counting how often it was made."""

    def __init__(self, result: str = "r", fail_first: BaseException | None = None) -> None:
        self.made = 0
        self.release = asyncio.Event()
        self.result = result
        self.fail_first = fail_first

    async def __call__(self) -> str:
        self.made += 1
        await self.release.wait()
        if self.fail_first is not None and self.made == 1:
            raise self.fail_first
        return self.result


async def _started(flight: InFlight, key: str, followers: int) -> None:
    await until(lambda: flight.sharing(key) >= followers, interval=0, what=f"{followers} followers")


async def test_concurrent_callers_of_one_key_share_one_call() -> None:
    flight, call = InFlight(), Calls()
    tasks = [asyncio.create_task(flight.run("k", call)) for _ in range(5)]
    await _started(flight, "k", 4)
    call.release.set()
    results = await asyncio.gather(*tasks)
    assert call.made == 1
    assert sorted(results) == [("r", False)] * 4 + [("r", True)]
    assert flight.sharing("k") == 0  # nothing left in flight
    assert await flight.run("k", call) == ("r", True)  # a later caller makes its own


async def test_other_keys_are_not_shared() -> None:
    flight, call = InFlight(), Calls()
    call.release.set()
    assert [await flight.run(k, call) for k in ("a", "b")] == [("r", True), ("r", True)]
    assert call.made == 2


@pytest.mark.parametrize("failure", [RuntimeError("down"), asyncio.CancelledError()])
async def test_a_call_that_fails_is_not_shared(failure: BaseException) -> None:
    flight, call = InFlight(), Calls(fail_first=failure)
    leader = asyncio.create_task(flight.run("k", call))
    await _started(flight, "k", 0)
    followers = [asyncio.create_task(flight.run("k", call)) for _ in range(3)]
    await _started(flight, "k", 3)
    call.release.set()
    with pytest.raises(type(failure)):
        await leader
    # Each follower made the call itself, and got its own result.
    assert await asyncio.gather(*followers) == [("r", True)] * 3
    assert call.made == 4


def test_a_result_crosses_event_loops() -> None:
    flight = InFlight()
    started, release = threading.Event(), threading.Event()
    made = 0

    async def call() -> str:
        nonlocal made
        made += 1
        started.set()
        await asyncio.to_thread(release.wait, 30)
        return "r"

    async def follow() -> tuple[str, bool]:
        await asyncio.to_thread(started.wait, 30)  # the leader's call is in flight

        async def release_once_shared() -> None:
            await until(lambda: flight.sharing("k") >= 1, interval=0.001, what="a follower")
            release.set()

        releasing = asyncio.create_task(release_once_shared())
        result = await flight.run("k", call)
        await releasing
        return result

    followed: list[tuple[str, bool]] = []
    thread = threading.Thread(target=lambda: followed.append(run_sync(follow())))
    thread.start()
    led = run_sync(flight.run("k", call))
    thread.join(timeout=30)
    assert (led, followed, made) == (("r", True), [("r", False)], 1)
