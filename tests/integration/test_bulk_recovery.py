"""Orphans in bulk, on both backends: one reaper pass recovers every orphan through the
worker's slots (never more at once than it has), shares the slots with runs that wait by
the fair rule, ends on stop, and takes each orphan at most once; ``tether reap``'s pass
takes every orphan in batches; a batch's claim counts attempts and fails the exhausted.

Reaper intervals are an hour, so anything recovered was recovered by the first pass."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import downstream
import inprocess
import pytest
import sqlalchemy as sa
from waiting import until

from tether import Agent, Engine, MemoryNotifier, Run, Scope, ScriptedModel, StopKind
from tether.config import Settings
from tether.store import Intent, Store
from tether.store.sql.schema import runs
from tether.worker import Worker

DEAD = "dead-host:1:0"  # the owner that crashed
HEARTBEAT_S = 0.3
# Two workers in one event loop, each beating for three runs: a loaded machine can hold that
# loop past 0.3 s, and the other worker would then rightly take a live run for an orphan.
TWO_WORKERS_HEARTBEAT_S = 2.0
HOUR = 3600.0
WAIT_S = 60.0  # for what a two-core machine under load does slowly


def _lookup_turn(store: Store, run: Run) -> None:
    """The script's first turn (a read), durable with its intent; the read never ran."""
    call = {
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"query": "x"}'},
    }
    store.persist_turn(
        run.lease(),
        seq=run.message_count,
        message={"role": "assistant", "content": None, "tool_calls": [call]},
        spend_usd=0.0,
        elapsed_ms=1,
        intents=[
            Intent(tool_call_id="call_0_0", tool="lookup", arguments={"query": "x"}, effect="read")
        ],
        final=False,
        event={},
    )


async def orphans(
    engine: Engine, count: int, *, user: str = "dana", turns: bool = False
) -> list[str]:
    """``count`` runs claimed by an owner that then died (every other one after writing
    its first turn, if ``turns``), once their heartbeats are stale."""
    ids = [(await engine.start_run(user, f"orphan {i}")).id for i in range(count)]
    for i, run_id in enumerate(ids):
        run = engine.runner.store.claim_ready(DEAD, run_id)
        assert run is not None
        if turns and i % 2 == 0:
            _lookup_turn(engine.runner.store, run)
    last = engine.runner.store.get_run(ids[-1])
    assert last is not None and last.heartbeat_at is not None
    heartbeat = last.heartbeat_at

    async def stale() -> bool:
        return await engine.now() - heartbeat > engine.settings.heartbeat_timeout_s * 1.5

    await until(stale, timeout=WAIT_S)
    return ids


def recovering(engine: Engine, run_id: str) -> int:
    return sum(1 for e in engine.runner.store.events(run_id) if e.kind == "recovering")


def answered(engine: Engine, ids: list[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        found = [(await engine.get_run(i)).run for i in ids]
        return all(r is not None and r.state.value == "answered" for r in found)

    return check


async def stopped(worker: Worker, running: asyncio.Task[None]) -> None:
    worker.stop()
    await asyncio.wait_for(running, timeout=60)


# -- one pass, through the slots -----------------------------------------------------------


async def test_one_reaper_pass_recovers_every_orphan_through_the_slots(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = inprocess.engine(
        db_url, script_name="work", heartbeat_timeout_s=HEARTBEAT_S, reaper_interval_s=HOUR
    )
    ids = await orphans(engine, 20, turns=True)
    in_flight = {"now": 0, "most": 0}
    recover = engine.runner.recover

    async def counted(run: Run, **options: Any) -> Any:
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            return await recover(run, **options)
        finally:
            in_flight["now"] -= 1

    monkeypatch.setattr(engine.runner, "recover", counted)
    worker = Worker(engine, concurrency=2)
    running = asyncio.create_task(worker.run())
    try:
        await until(answered(engine, ids), timeout=120)
        await stopped(worker, running)
        # An hour's interval and no restart of the reaper: the first pass took them all.
        assert not worker.restarts
        assert [recovering(engine, i) for i in ids] == [1] * 20
        assert {r.recovery_attempts for i in ids if (r := engine.runner.store.get_run(i))} == {1}
        assert 1 <= in_flight["most"] <= 2  # through the worker's two slots, never more
        # Each was carried on in the slot that recovered it: never handed back to be
        # claimed (and its history read) again.
        handed_back = [
            e for i in ids for e in engine.runner.store.events(i) if e.kind == "released"
        ]
        assert handed_back == []
    finally:
        await stopped(worker, running)
        engine.close()
    records = [key for key, tool, _ in downstream.effects() if tool == "record"]
    assert len(records) == len(set(records)) == 20  # each run's write applied once


@pytest.mark.slow
async def test_two_workers_recover_each_orphan_once(db_url: str) -> None:
    engines = [
        inprocess.engine(
            db_url,
            script_name="work",
            heartbeat_timeout_s=TWO_WORKERS_HEARTBEAT_S,
            reaper_interval_s=HOUR,
        )
        for _ in range(2)
    ]
    ids = await orphans(engines[0], 30, turns=True)
    workers = [Worker(e, concurrency=3) for e in engines]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await until(answered(engines[0], ids), timeout=120)
        assert [recovering(engines[0], i) for i in ids] == [1] * 30
        events = [
            e for i in ids for e in engines[0].runner.store.events(i) if e.kind == "recovering"
        ]
        assert {e.data["owner"] for e in events} <= {e.runner.worker_id for e in engines}
    finally:
        for worker, task in zip(workers, tasks, strict=True):
            await stopped(worker, task)
        for e in engines:
            e.close()


# -- the fair rule -------------------------------------------------------------------------


class Gate:
    """A scope resolver that holds runs at their first step after a claim, counting how
    many it holds per user: olga's (the orphans) until ``opened``, dana's (the queue)
    one per ``turns.release()``."""

    def __init__(self) -> None:
        self.armed = False
        self.opened = asyncio.Event()
        self.turns = asyncio.Semaphore(0)
        self.held: collections.Counter[str] = collections.Counter()
        self.most: collections.Counter[str] = collections.Counter()
        self.entered: collections.Counter[str] = collections.Counter()

    async def resolve(self, user_id: str) -> Scope:
        if self.armed:
            self.entered[user_id] += 1
            self.held[user_id] += 1
            self.most[user_id] = max(self.most[user_id], self.held[user_id])
            try:
                await (self.opened.wait() if user_id == "olga" else self.turns.acquire())
            finally:
                self.held[user_id] -= 1
        return Scope(user_id=user_id)

    def holding(self, **counts: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return all(self.held[user] == n for user, n in counts.items())

        return check

    def release_all(self, count: int) -> None:
        for _ in range(count):
            self.turns.release()


async def gated_orphans(url: str, gate: Gate, count: int) -> tuple[Engine, list[str]]:
    """An engine whose scope resolver is ``gate``, and ``count`` of olga's runs claimed
    by an owner whose heartbeat is an hour old (set directly: the heartbeat timeout is
    long here, so that runs held at the gate never go stale)."""
    engine = Engine(
        agent=Agent(name="gated", system_prompt="Answer.", resolve_scope=gate.resolve),
        model=ScriptedModel([{"content": "ok"}]),
        settings=Settings(database_url=url, heartbeat_timeout_s=60.0, reaper_interval_s=HOUR),
        notifier=MemoryNotifier(),
    )
    ids = [(await engine.start_run("olga", f"orphan {i}")).id for i in range(count)]
    for run_id in ids:
        assert engine.runner.store.claim_ready(DEAD, run_id) is not None
    with engine.runner.store.engine.begin() as conn:
        old = runs.c.heartbeat_at - HOUR
        conn.execute(sa.update(runs).where(runs.c.id.in_(ids)).values(heartbeat_at=old))
    return engine, ids


async def test_while_runs_wait_recoveries_hold_only_their_share_of_the_slots(db_url: str) -> None:
    gate = Gate()
    engine, ids = await gated_orphans(db_url, gate, 10)
    queued = [(await engine.start_run("dana", f"queued {i}")).id for i in range(8)]
    gate.armed = True
    worker = Worker(engine, concurrency=4)
    share = worker.orphan_share
    running = asyncio.create_task(worker.run())
    try:
        await until(partial(_entered, gate, 4), timeout=WAIT_S)
        # Each queued run let through frees a slot; it goes to an orphan until the
        # recoveries hold their share, then to the queue, which keeps the rest.
        for _ in range(8):
            if gate.held["olga"] == share:
                break
            gate.turns.release()
            await until(
                partial(_entered, gate, gate.entered.total() + 1), timeout=WAIT_S
            )  # slot refilled
            assert sum(gate.held.values()) == 4
        assert gate.held["olga"] == share and gate.held["dana"] == 4 - share
        assert gate.most["olga"] == share < worker.concurrency
        # The queue drains: with no run waiting, the recoveries take every slot.
        gate.release_all(len(queued))
        await until(answered(engine, queued), timeout=WAIT_S)
        await until(gate.holding(olga=worker.concurrency), timeout=WAIT_S)
        gate.opened.set()
        await until(answered(engine, ids), timeout=WAIT_S)
        assert not worker.restarts  # one pass (an hour's interval)
        assert [recovering(engine, i) for i in ids] == [1] * 10
    finally:
        gate.opened.set()
        gate.release_all(len(queued))
        await stopped(worker, running)
        engine.close()


async def _entered(gate: Gate, count: int) -> bool:
    return gate.entered.total() >= count


async def test_stop_ends_a_reaper_pass_after_the_recoveries_in_hand(db_url: str) -> None:
    gate = Gate()
    engine, ids = await gated_orphans(db_url, gate, 10)
    gate.armed = True
    worker = Worker(engine, concurrency=2)
    running = asyncio.create_task(worker.run())
    try:
        await until(gate.holding(olga=2), timeout=WAIT_S)
        worker.stop()
        gate.opened.set()
        await asyncio.wait_for(running, timeout=60)
        taken = [i for i in ids if recovering(engine, i)]
        assert len(taken) == 2  # the two in hand, handed back; no claim after stop
        left = [engine.runner.store.get_run(i) for i in ids if i not in taken]
        assert all(r is not None and r.owner == DEAD and r.recovery_attempts == 0 for r in left)
    finally:
        gate.opened.set()
        await stopped(worker, running)
        engine.close()


# -- the claims of a pass ------------------------------------------------------------------


async def test_a_pass_takes_an_orphan_at_most_once_even_when_it_goes_stale_again(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="work", heartbeat_timeout_s=HEARTBEAT_S)
    (run_id,) = await orphans(engine, 1)
    store = engine.runner.store
    began = store.now()
    params: dict[str, Any] = {"stale_after_s": HEARTBEAT_S, "max_attempts": 5, "batch": 5}
    try:
        got, _ = store.claim_orphans(owner="reaper", before=began, **params)
        assert [r.id for r in got] == [run_id]
        claimed_at = got[0].heartbeat_at or 0.0

        async def stale_again() -> bool:
            return await engine.now() - claimed_at > HEARTBEAT_S * 1.5

        await until(stale_again, timeout=WAIT_S)  # the recovery stalled: its run is an orphan again
        assert store.claim_orphans(owner="reaper", before=began, **params) == ([], [])
        again, _ = store.claim_orphans(owner="next-pass", **params)  # the next pass may
        assert [(r.id, r.recovery_attempts) for r in again] == [(run_id, 2)]
    finally:
        engine.close()


async def test_reap_takes_every_orphan_in_one_pass_in_batches(db_url: str) -> None:
    engine = inprocess.engine(
        db_url, script_name="work", heartbeat_timeout_s=HEARTBEAT_S, reaper_batch=5
    )
    ids = await orphans(engine, 12, turns=True)
    try:
        outcomes = await engine.runner.recover_orphans()
        assert sorted(o.run_id for o in outcomes) == sorted(ids)
        assert {o.kind for o in outcomes} == {StopKind.RELEASED}
        runs = [engine.runner.store.get_run(i) for i in ids]
        assert all(r is not None and r.owner is None and r.recovery_attempts == 1 for r in runs)
    finally:
        engine.close()


async def test_a_batch_claim_counts_attempts_and_fails_the_exhausted(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="work", heartbeat_timeout_s=HEARTBEAT_S)
    ids = await orphans(engine, 4)
    store = engine.runner.store
    params: dict[str, Any] = {"stale_after_s": HEARTBEAT_S, "max_attempts": 1, "batch": 2}
    try:
        first, _ = store.claim_orphans(owner="reaper-1", **params)  # the two oldest
        assert len(first) == 2
        heartbeat = max(r.heartbeat_at or 0.0 for r in first)

        async def stale() -> bool:
            return await engine.now() - heartbeat > HEARTBEAT_S * 1.5

        await until(stale, timeout=WAIT_S)
        claimed, exhausted = store.claim_orphans(owner="reaper-2", **{**params, "batch": 4})
        _check_batch(store, ids, first, claimed, exhausted)
    finally:
        engine.close()


def _check_batch(
    store: Store, ids: list[str], first: list[Run], claimed: list[Run], exhausted: list[str]
) -> None:
    assert sorted(exhausted) == sorted(r.id for r in first)
    assert sorted(r.id for r in claimed) == sorted(set(ids) - set(exhausted))
    assert all(r.owner == "reaper-2" and r.recovery_attempts == 1 for r in claimed)
    for run in claimed:
        (event,) = [e for e in store.events(run.id) if e.kind == "recovering"]
        assert event.data == {"recovery_attempts": 1, "owner": "reaper-2"}
    for run_id in exhausted:
        failed = store.get_run(run_id)
        assert failed is not None and failed.state.value == "failed" and failed.owner is None
        assert failed.fail_reason == "recovery_exhausted"
        (event,) = [e for e in store.events(run_id) if e.kind == "failed"]
        assert event.data == {"reason": "recovery_exhausted", "recovery_attempts": 1}
