"""The pacer: the model requests in flight bounded by the event loop's lag (``pacing.py``).
Fed lag samples directly, so nothing here depends on how busy the machine is."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tether._runtime.shared.pacing import FLOOR, TARGET_S, Pacer


async def _hold(pacer: Pacer, count: int, stack: contextlib.AsyncExitStack) -> None:
    for _ in range(count):
        await stack.enter_async_context(pacer.request())


async def test_a_process_whose_loop_keeps_up_is_never_paced() -> None:
    pacer = Pacer(watch=False)
    async with contextlib.AsyncExitStack() as stack:
        await _hold(pacer, 500, stack)
        pacer.adjust(0.0)
        assert pacer.limit == float("inf")
        assert pacer.in_flight == 500 and pacer.waiting == 0


async def test_the_limit_falls_while_the_loop_lags_and_later_requests_wait() -> None:
    pacer = Pacer(watch=False)
    async with contextlib.AsyncExitStack() as stack:
        await _hold(pacer, 100, stack)
        pacer.adjust(TARGET_S * 4)
        assert pacer.limit == pytest.approx(90)
        late = asyncio.create_task(pacer.request().__aenter__())
        await asyncio.sleep(0)
        assert not late.done() and pacer.waiting == 1
        late.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await late
        assert pacer.waiting == 0 and pacer.in_flight == 100


async def test_the_limit_rises_while_runs_wait_and_the_loop_keeps_up() -> None:
    pacer = Pacer(watch=False)
    async with contextlib.AsyncExitStack() as stack:
        await _hold(pacer, 40, stack)
        pacer.adjust(1.0)  # 40 -> 36: the 40 in flight go on, new ones wait
        waiting = [
            asyncio.create_task(stack.enter_async_context(pacer.request())) for _ in range(5)
        ]
        await asyncio.sleep(0)
        assert pacer.waiting == 5
        for _ in range(3):
            pacer.adjust(0.0)  # 36 -> 37.8 -> 39.69 -> 41.67: two places above the 40
        await asyncio.sleep(0)
        assert pacer.in_flight == 42 and pacer.waiting == 3
        assert [w.done() for w in waiting] == [True, True, False, False, False]
        for task in waiting[2:]:
            task.cancel()
        await asyncio.gather(*waiting[2:], return_exceptions=True)


async def test_the_limit_never_falls_below_the_floor() -> None:
    pacer = Pacer(watch=False)
    async with contextlib.AsyncExitStack() as stack:
        await _hold(pacer, FLOOR + 4, stack)
        for _ in range(50):
            pacer.adjust(1.0)
        assert pacer.limit == FLOOR


async def test_places_freed_go_to_the_runs_waiting_longest() -> None:
    pacer = Pacer(watch=False)
    order: list[int] = []

    async def one(n: int) -> None:
        async with pacer.request():
            order.append(n)

    async with contextlib.AsyncExitStack() as stack:
        await _hold(pacer, FLOOR, stack)
        pacer.adjust(1.0)  # limited to the floor, all of it taken
        tasks = []
        for n in range(3):
            tasks.append(asyncio.create_task(one(n)))
            await asyncio.sleep(0)
        assert order == [] and pacer.waiting == 3
    await asyncio.gather(*tasks)  # the held places were given back on leaving the stack
    assert order == [0, 1, 2]
    assert pacer.in_flight == 0
