"""``@tool(timeout_s=..., retries=N)`` (reference §10): what a declaration may say, and the
bounded call itself (``tether.tools._timeouts``): a call past its timeout is abandoned, not waited
on, and an overrun write is known to be still at work until it ends."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from waiting import until

from tether import Reconciled, Scope, ToolContext, ToolUnavailable, tool
from tether.errors import ConfigError
from tether.tools._timeouts import still_running, within
from tether.tools.tool import DEFAULT_TIMEOUT_S, ReconcileKind, ToolFailed, UnsafeTool


def _noop() -> dict[str, str]:
    """Does nothing."""
    return {"ok": "yes"}


def _absent(key: str, ctx: ToolContext) -> Reconciled:
    return Reconciled.absent()


def _ctx(key: str) -> ToolContext:
    return ToolContext(
        run_id="r", user_id="u", tool_call_id="c", idempotency_key=key, scope=Scope(user_id="u")
    )


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a blocked thread waits on; set at teardown so no thread outlives the test."""
    event = threading.Event()
    yield event
    event.set()


def test_a_tool_times_out_after_60_s_and_is_not_retried_unless_declared() -> None:
    declared = tool(_noop)
    assert (declared.timeout_s, declared.retries) == (DEFAULT_TIMEOUT_S, 0) == (60.0, 0)
    assert (tool(timeout_s=2.5, retries=3)(_noop).timeout_s, tool(retries=3)(_noop).retries) == (
        2.5,
        3,
    )


@pytest.mark.parametrize("timeout", [0, -1, 0.0, math.inf, math.nan, "5", True, None])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(timeout: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        tool(timeout_s=timeout)(_noop)
    assert refused.value.code == "invalid_config"
    assert "_noop" in refused.value.message and "timeout_s" in refused.value.message


@pytest.mark.parametrize("retries", [-1, 1.5, "2", True, None])
def test_retries_that_are_not_a_whole_number_are_refused(retries: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        tool(retries=retries)(_noop)
    assert refused.value.code == "invalid_config"
    assert "retries" in refused.value.message


def test_retries_on_a_write_are_refused_with_what_happens_instead() -> None:
    with pytest.raises(UnsafeTool) as refused:
        tool(effect="write", reconcile=_absent, retries=1)(_noop)
    assert refused.value.code == "unsafe_tool"
    assert "never runs a write again blindly" in refused.value.message
    assert "reconciled by its idempotency key" in refused.value.message
    # A write may still declare its timeout, and zero retries.
    assert tool(effect="write", reconcile=_absent, timeout_s=5, retries=0)(_noop).timeout_s == 5


def test_tool_unavailable_is_a_definite_failure_with_its_own_code() -> None:
    assert issubclass(ToolUnavailable, ToolFailed)
    assert ToolUnavailable("down").to_dict()["error"] == "tool_unavailable"


async def test_an_async_call_past_its_timeout_is_cancelled_and_not_waited_on() -> None:
    cancelled = asyncio.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    with pytest.raises(TimeoutError, match=r"hang did not answer within 0\.05 s"):
        await within(hang, (), {}, timeout_s=0.05)
    await asyncio.wait_for(cancelled.wait(), 5)
    assert cancelled.is_set()


async def test_a_thread_past_its_timeout_is_abandoned_and_known_to_still_run(
    gate: threading.Event,
) -> None:
    def blocked(n: int) -> int:
        gate.wait()
        return n

    with pytest.raises(TimeoutError):
        await within(blocked, (), {"n": 1}, timeout_s=0.05, key="k-thread")
    assert still_running("k-thread")
    gate.set()
    await until(lambda: not still_running("k-thread"), timeout=10, what="the thread to end")
    # Answers in time come back as they are, errors too.
    assert await within(blocked, (), {"n": 2}, timeout_s=5) == 2

    def broken() -> None:
        raise ToolUnavailable("down")

    with pytest.raises(ToolUnavailable):
        await within(broken, (), {}, timeout_s=5)


async def test_absent_is_not_believed_while_an_overrun_write_still_runs(
    gate: threading.Event,
) -> None:
    @tool(effect="write", reconcile=_absent, timeout_s=0.05)
    def slow_write(ctx: ToolContext, item: str) -> dict[str, str]:
        """A write stuck downstream."""
        gate.wait()
        return {"item": item}

    ctx = _ctx("k-absent")
    with pytest.raises(TimeoutError):
        await slow_write.call(slow_write.validate({"item": "a"}), ctx)
    found = await slow_write.find_outcome("k-absent", ctx)
    assert found.kind is ReconcileKind.UNREACHABLE
    assert "still runs" in str(found.result)
    gate.set()
    await until(lambda: not still_running("k-absent"), timeout=10, what="the write to end")
    assert (await slow_write.find_outcome("k-absent", ctx)).kind is ReconcileKind.ABSENT


async def test_plain_calls_reuse_idle_daemon_threads_and_a_hung_one_keeps_only_its_own(
    gate: threading.Event,
) -> None:
    def whose() -> threading.Thread:
        return threading.current_thread()

    first = await within(whose, (), {}, timeout_s=5)
    # Idle threads (this one, and any earlier tests left) take the next calls: none is new.
    idle = {t for t in threading.enumerate() if t.name == "tether-tool"}
    again = [await within(whose, (), {}, timeout_s=5) for _ in range(5)]
    assert first.daemon  # a daemon thread: a hung call never holds the process's exit
    assert first in idle and set(again) <= idle  # reused, not one thread per call

    def blocked() -> int:
        gate.wait()
        return 0

    with pytest.raises(TimeoutError):
        await within(blocked, (), {}, timeout_s=0.05)
    # The hung call keeps its thread; the next call runs at once on another.
    other = await within(whose, (), {}, timeout_s=5)
    tools = [t for t in threading.enumerate() if t.name == "tether-tool"]
    assert other in tools and len(tools) >= 2
