"""The worker in-process, on both backends: side tasks beside the claim loop (a webhook that
never answers stalls nothing, a side task that dies is restarted), orphans recovered into
free slots, a failed start released without spending a recovery attempt, memory bounded
over thousands of runs, and PostgreSQL's LISTEN waking an idle worker."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
from functools import partial
from typing import Any

import downstream
import heartbeats
import inprocess
import pytest
from waiting import until

from tether import Agent, Engine, MemoryNotifier, Outcome, Run, Scope, ScriptedModel, StopKind
from tether import worker as worker_module
from tether.config import Settings
from tether.errors import FailpointError
from tether.failpoints import clear_failpoints, set_failpoint
from tether.notify import Notice
from tether.results import LiveEvent
from tether.webhook import WebhookNotifier
from tether.worker import Worker

# -- helpers ------------------------------------------------------------------------------


async def states(engine: Engine, ids: list[str]) -> list[str]:
    found = [(await engine.get_run(i)).run for i in ids]
    return [r.state.value if r is not None else "missing" for r in found]


async def all_in(engine: Engine, ids: list[str], state: str) -> bool:
    return all(s == state for s in await states(engine, ids))


class Refusing:
    """A notifier that never delivers, so the suspension's notice is due for re-issue."""

    async def send(self, notice: Notice) -> bool:
        return False


class Watched:
    """Wraps a notifier and counts the sends that started and those that returned."""

    def __init__(self, inner: WebhookNotifier) -> None:
        self.inner = inner
        self.started = 0
        self.returned = 0

    async def send(self, notice: Notice) -> bool:
        self.started += 1
        try:
            return await self.inner.send(notice)
        finally:
            self.returned += 1


class Silent:
    """A TCP server that accepts connections and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.accepted: list[socket.socket] = []
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)

    def close(self) -> None:
        self.closing.set()
        self.thread.join(timeout=10)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


# -- a webhook that never answers ---------------------------------------------------------


async def test_a_webhook_that_never_answers_does_not_delay_claiming(db_url: str) -> None:
    setup = inprocess.engine(db_url, script_name="send", notifier=Refusing())
    silent = Silent()
    # A notifier whose every try waits far longer than this test polls.
    notifier = Watched(WebhookNotifier(silent.url, attempts=4, timeout_s=120))
    # A re-issued notice must start within its delivery window (0.5 s here, the heartbeat
    # timeout); on a loaded machine it may not, and is dropped to be re-issued at the next
    # pass, so the passes come every second rather than every minute.
    engine = inprocess.engine(
        db_url,
        script_name="answer",
        notifier=notifier,
        heartbeat_timeout_s=0.5,
        reaper_interval_s=1.0,
    )
    worker = Worker(engine, concurrency=4)
    running: asyncio.Task[None] | None = None
    try:
        suspended = [(await setup.ask("dana", f"send {i}")).run_id for i in range(3)]
        assert await all_in(engine, suspended, "suspended")
        # Due for re-issue once their suspension is older than the heartbeat timeout.
        await until(lambda: _older_than(engine, suspended, 0.6), what="notices due")
        running = asyncio.create_task(worker.run())
        await until(lambda: silent.accepted, what="the webhook to hang")
        plain = [(await engine.start_run("dana", f"plain {i}")).id for i in range(5)]
        await until(lambda: all_in(engine, plain, "answered"), what="plain runs answered")
        # The re-issued notices went to a webhook that hangs; the plain runs answered anyway.
        assert notifier.started >= 1
        reissued = [e for i in suspended for e in await engine.events(i)]
        first_reissue = min(e.id for e in reissued if e.kind == "notice_reissued")
        answered = [await _event(engine, i, "answered") for i in plain]
        created = [await _event(engine, i, "created") for i in plain]
        assert all(first_reissue < e.id for e in created + answered)
        worker.stop()
        # stop() ends the hanging side task too, long before the webhook would time out.
        await asyncio.wait_for(running, timeout=60)
        assert worker.counts["answered"] == 5
    finally:
        if running is not None and not running.done():
            running.cancel()
        silent.close()
        setup.close()
        engine.close()


async def _older_than(engine: Engine, ids: list[str], seconds: float) -> bool:
    now = await engine.now()
    runs = [(await engine.get_run(i)).run for i in ids]
    return all(r is not None and now - (r.suspended_at or now) > seconds for r in runs)


async def _event(engine: Engine, run_id: str, kind: str) -> LiveEvent:
    return next(e for e in await engine.events(run_id) if e.kind == kind)


# -- side tasks under the monitor ---------------------------------------------------------


async def test_a_reaper_that_raises_is_logged_and_restarted(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Choice: a side task that raises is restarted after a backoff (the worker keeps
    claiming), with a structured log record; it is never left dead."""
    engine = inprocess.tiny_engine(db_url, reaper_interval_s=0.05)
    monkeypatch.setattr(worker_module, "RESTART_FIRST_S", 0.05)
    calls = 0
    expire = engine.runner.expire_suspended

    async def broken_once() -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the reaper broke")
        return await expire()

    monkeypatch.setattr(engine.runner, "expire_suspended", broken_once)
    caplog.set_level(logging.WARNING, logger="tether.worker")
    worker = Worker(engine, concurrency=2)
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: calls >= 3, what="the reaper to run again after it broke")
        run = await engine.start_run("dana", "still claiming?")
        await until(lambda: all_in(engine, [run.id], "answered"), what="a run answered")
        assert worker.restarts == {"reaper": 1}
        records = [r for r in caplog.records if getattr(r, "action", "") == "side_task_restart"]
        assert [getattr(r, "task", None) for r in records] == ["reaper"]
        # By its type and frames: an error's message is content unless TETHER_LOG_CONTENT.
        assert getattr(records[0], "error_type", "") == "RuntimeError"
        assert "broken_once" in getattr(records[0], "trace", "")
        assert records[0].exc_info is None and not hasattr(records[0], "error")
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=30)
        engine.close()
    assert running.exception() is None


async def test_a_listener_that_cannot_connect_is_restarted_and_claiming_goes_on(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = inprocess.tiny_engine(db_url)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens on this port now
    dsn = f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=2"
    monkeypatch.setattr(engine.runner.store, "listen_dsn", lambda: dsn)
    monkeypatch.setattr(worker_module, "RESTART_FIRST_S", 0.05)
    caplog.set_level(logging.WARNING, logger="tether.worker")
    worker = Worker(engine, concurrency=2, poll_s=0.1)
    running = asyncio.create_task(worker.run(reap=False))
    try:
        await until(lambda: worker.restarts["listener"] >= 2, what="listener restarts")
        run = await engine.start_run("dana", "polled")
        await until(lambda: all_in(engine, [run.id], "answered"), what="a run answered")
        tasks = {getattr(r, "task", None) for r in caplog.records if r.name == "tether.worker"}
        assert tasks == {"listener"}
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=30)
        engine.close()


async def test_postgresql_wakes_an_idle_worker_by_notify(pg_url: str) -> None:
    engine = inprocess.tiny_engine(pg_url)
    worker = Worker(engine, concurrency=2, poll_s=3600)  # only a NOTIFY can wake it
    running = asyncio.create_task(worker.run(reap=False))
    try:
        # The first notice may be sent before the listener connects; keep the run count
        # at one per wake-up so each answered run proves a NOTIFY arrived.
        for i in range(3):
            run = await engine.start_run("dana", f"wake {i}")
            await until(partial(all_in, engine, [run.id], "answered"), what="woken")
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=30)
        engine.close()


# -- orphans, failed starts ---------------------------------------------------------------


async def leave_orphans(url: str, count: int) -> list[str]:
    """Runs left running by an owner that stopped after a write committed (a failpoint
    raising in this process stands for a crash): orphans once their heartbeat is stale."""
    crasher = inprocess.engine(url, script_name="work")
    try:
        ids = [(await crasher.start_run("dana", f"orphan {i}")).id for i in range(count)]
        set_failpoint("after_tool_commit", "error", tool="record")
        for run_id in ids:
            with pytest.raises(FailpointError):
                await crasher.run_until_stop(run_id)
    finally:
        clear_failpoints()
        crasher.close()
    return ids


async def test_orphans_are_claimed_into_free_slots_and_recovered_by_the_worker(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await leave_orphans(db_url, 3)
    engine = inprocess.engine(
        db_url, script_name="work", heartbeat_timeout_s=0.3, reaper_interval_s=0.05
    )
    limits: list[int] = []
    claim = engine.runner.claim_orphans

    async def counted(limit: int, **kwargs: Any) -> Any:
        limits.append(limit)
        return await claim(limit, **kwargs)

    monkeypatch.setattr(engine.runner, "claim_orphans", counted)
    worker = Worker(engine, concurrency=1)
    running = asyncio.create_task(worker.run())
    try:
        await until(lambda: all_in(engine, ids, "answered"), what="orphans answered")
        worker.stop()
        await asyncio.wait_for(running, timeout=30)
        assert limits and set(limits) == {1}  # never more orphans than free slots
        for run_id in ids:
            run = (await engine.get_run(run_id)).run
            assert run is not None and run.recovery_attempts == 1
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=30)
        engine.close()
    records = [key for key, tool, _ in downstream.effects() if tool == "record"]
    assert len(records) == len(set(records)) == 3  # each write applied once


async def test_a_busy_worker_takes_orphans_before_new_runs(db_url: str) -> None:
    (orphan,) = await leave_orphans(db_url, 1)
    # One pass only (at start): the reaper waits up to an interval for a slot.
    engine = inprocess.engine(
        db_url, script_name="work", heartbeat_timeout_s=0.3, reaper_interval_s=30
    )
    worker = Worker(engine, concurrency=1)
    running: asyncio.Task[None] | None = None
    try:
        queued = [(await engine.start_run("dana", f"queued {i}")).id for i in range(8)]
        await until(partial(heartbeats.owner_stale, engine, orphan, 0.4), what="the orphan stale")
        running = asyncio.create_task(worker.run())
        await until(lambda: all_in(engine, [orphan, *queued], "answered"), what="all answered")
        # Its one slot always wanted by the queue, the worker gave the first slot that
        # freed to the orphan rather than to the next queued run.
        recovering = (await _event(engine, orphan, "recovering")).id
        answered = sorted([(await _event(engine, i, "answered")).id for i in queued])
        assert recovering < answered[1]
    finally:
        worker.stop()
        if running is not None:
            await asyncio.wait_for(running, timeout=30)
        engine.close()


async def test_a_failed_start_is_released_without_spending_a_recovery_attempt(
    db_url: str,
) -> None:
    failing = {"armed": False, "calls": 0}

    async def resolve(user_id: str) -> Scope:
        failing["calls"] += 1
        if failing["armed"]:
            failing["armed"] = False
            raise ConnectionError("the scope service is down")
        return Scope(user_id=user_id)

    engine = Engine(
        agent=Agent(name="flaky-scope", system_prompt="Answer.", resolve_scope=resolve),
        model=ScriptedModel([{"content": "ok"}]),
        settings=Settings(database_url=db_url, start_retry_s=0.2),
        notifier=MemoryNotifier(),
    )
    worker = Worker(engine, concurrency=2)
    running: asyncio.Task[None] | None = None
    try:
        run = await engine.start_run("dana", "q")  # resolves the scope once, unarmed
        failing["armed"] = True
        running = asyncio.create_task(worker.run())
        await until(lambda: all_in(engine, [run.id], "answered"), what="carried to its end")
        kinds = [e.kind for e in await engine.events(run.id)]
        assert "start_failed" in kinds and kinds.index("start_failed") < kinds.index("answered")
        after = (await engine.get_run(run.id)).run
        assert after is not None and after.recovery_attempts == 0
    finally:
        worker.stop()
        if running is not None:
            await asyncio.wait_for(running, timeout=30)
        engine.close()
    assert failing["calls"] == 3  # start_run, the failed start, the start that carried it
    assert worker.counts == {"released": 1, "answered": 1}


# -- bounded memory -------------------------------------------------------------------------


async def _answered(worker: Worker, total: int) -> bool:
    return worker.counts["answered"] >= total


def _retained(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


@pytest.mark.slow
async def test_memory_stays_bounded_over_thousands_of_runs(db_url: str) -> None:
    engine = inprocess.tiny_engine(db_url)
    worker = Worker(engine, concurrency=8)
    running = asyncio.create_task(worker.run(reap=False))
    counted: list[tuple[int, int]] = []
    try:
        total = 0
        for batch in (200, 1800):
            for i in range(batch):
                await engine.start_run("dana", f"tiny {total + i}")
            total += batch
            await until(partial(_answered, worker, total), timeout=300, what="runs")
            await until(lambda: not worker._tasks, what="no task left")
            counted.append((_retained(Outcome), _retained(Run)))
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=60)
        engine.close()
    assert dict(worker.counts) == {StopKind.ANSWERED.value: 2000}
    (outcomes_at_200, runs_at_200), (outcomes_at_2000, runs_at_2000) = counted
    # Nothing the worker keeps grows with the number of runs it carried.
    assert outcomes_at_2000 <= outcomes_at_200 + 8 and outcomes_at_2000 < 50
    assert runs_at_2000 <= runs_at_200 + 8 and runs_at_2000 < 50
    assert len(worker.counts) <= len(StopKind) + 1 and not worker.restarts


# -- exit when idle ----------------------------------------------------------------------


async def test_exit_when_idle_claims_again_when_a_run_ends_during_a_claim(db_url: str) -> None:
    """A claim that read the runs while the thread's first run was still in hand finds its
    follow-up blocked; the run ends before that claim returns. The worker must claim once
    more, not take the empty claim for idleness and exit with the follow-up left queued."""
    engine = inprocess.tiny_engine(db_url)
    worker = Worker(engine, concurrency=4)
    claim_many, carry = worker.engine.runner.claim_many, worker.engine.runner.carry
    gate = asyncio.Event()  # the first run is carried once a claim found nothing
    empty_while_carrying = 0

    async def held(run: Run, **kwargs: Any) -> Any:
        await gate.wait()
        return await carry(run, **kwargs)

    async def claim_then_let_the_run_end(limit: int) -> list[Run]:
        nonlocal empty_while_carrying
        in_hand = set(worker._tasks)
        claimed = await claim_many(limit)
        if in_hand and not claimed:
            empty_while_carrying += 1
            # The first empty claim ends a pass that claimed; the second is a pass of its
            # own, which claims nothing: the run ends (and frees its slot) before it returns.
            if empty_while_carrying == 2:
                gate.set()
                await asyncio.wait(in_hand)
        return claimed

    worker.engine.runner.claim_many = claim_then_let_the_run_end  # type: ignore[method-assign]
    worker.engine.runner.carry = held  # type: ignore[method-assign]
    try:
        first = await engine.start_run("dana", "first")
        follow_up = await engine.start_run(
            "dana", "second", thread_id=first.thread_id, if_busy="enqueue"
        )
        assert follow_up.state.value == "queued"
        await asyncio.wait_for(worker.run(exit_when_idle=True, reap=False), timeout=120)
        assert empty_while_carrying >= 2  # the race was forced
        assert await states(engine, [first.id, follow_up.id]) == ["answered", "answered"]
    finally:
        engine.close()
