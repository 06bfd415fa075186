"""Faults of the database and of the downstream, in process, on real databases: a store
call that meets a transient error is retried only if nothing of it was committed; a run
whose database goes away is let go, never failed, and finishes once it is back; the
heartbeat keeps an approval's lease; reconciliation waits for a downstream it cannot
reach; a hung notifier holds up no run.

The same faults with real processes (workers, serve, a restarted cluster) are in
tests/acceptance/test_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import downstream
import heartbeats
import inprocess
import pgproxy
import psycopg
import pytest
import sqlalchemy as sa
from agents import call
from store_runs import new_run
from waiting import poll_until

from conftest import PG_ADMIN_URL
from tether import Agent, Reconciled, Scope, ToolContext, tool
from tether._runtime.hop import hop
from tether.errors import DatabaseUnavailable
from tether.notify import MemoryNotifier, Notice
from tether.results import CallVerdict, StopKind
from tether.runs import RunState
from tether.store import Store


def _transient(url: str) -> Exception:
    """The driver's own error for a dropped connection on ``url``'s backend."""
    if url.startswith("sqlite"):
        return sqlite3.OperationalError("database is locked")
    return psycopg.OperationalError("server closed the connection unexpectedly")


def _fail_once(engine: sa.Engine, event: str, error: Exception) -> list[int]:
    """Make the next ``event`` of ``engine`` raise ``error`` once; counts the events."""
    seen: list[int] = []

    def hook(*_args: Any, **_kw: Any) -> None:
        seen.append(1)
        if len(seen) == 1:
            raise error

    sa.event.listen(engine, event, hook)
    return seen


# -- the retry mechanism -----------------------------------------------------------------------


async def test_a_call_cut_off_before_its_commit_is_retried_and_takes_effect_once(
    db_url: str,
) -> None:
    store = Store(db_url, retry_s=5.0)
    try:
        seen = _fail_once(store.engine, "before_cursor_execute", _transient(db_url))
        await hop(store.add_user, "erin", "key-of-erin-0123456789")
        assert len(seen) >= 2  # the first attempt failed, the second went through
        assert store.user_for_key("key-of-erin-0123456789") == "erin"
    finally:
        store.close()


async def test_a_call_cut_off_at_its_commit_is_not_retried_and_is_reported(db_url: str) -> None:
    """Choice: a COMMIT that failed may have landed, so the call is not tried again; the
    caller learns ``database_unavailable`` at once, however much retry time is left."""
    store = Store(db_url, retry_s=30.0)
    try:
        seen = _fail_once(store.engine, "commit", _transient(db_url))
        with pytest.raises(DatabaseUnavailable, match="outcome is unknown"):
            await hop(store.add_user, "erin", "key-of-erin-0123456789")
        assert len(seen) == 1
    finally:
        store.close()


async def test_a_step_write_cut_off_at_its_commit_is_retried_and_applied_once(
    db_url: str,
) -> None:
    """A step write is the exception: it cannot apply twice (it is conditional on the
    message count), so a COMMIT that failed is tried again. Here the COMMIT never reached
    the database; the retry applies the write, once (for a COMMIT that landed, see
    ``test_a_step_write_cut_off_after_its_commit_landed_...``)."""
    store = Store(db_url, retry_s=30.0)
    try:
        run_id = new_run(store)
        claimed = store.claim_ready("w1", run_id)
        assert claimed is not None
        seen = _fail_once(store.engine, "commit", _transient(db_url))
        await hop(
            store.persist_turn,
            claimed.lease(),
            seq=1,
            message={"role": "assistant", "content": "done"},
            spend_usd=0.01,
            elapsed_ms=1,
            intents=[],
            final=True,
            event={},
        )
        assert len(seen) >= 2  # the first COMMIT failed, the second went through
        assert store.messages(run_id) == [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "done"},
        ]
        run = store.get_run(run_id)
        assert run is not None and run.state is RunState.ANSWERED and run.budget.steps == 1
    finally:
        store.close()


async def test_an_error_that_is_not_transient_is_raised_as_it_is(db_url: str) -> None:
    store = Store(db_url, retry_s=30.0)
    try:
        seen = _fail_once(store.engine, "before_cursor_execute", ValueError("a bug"))
        with pytest.raises(ValueError, match="a bug"):
            await hop(store.add_user, "erin", "key-of-erin-0123456789")
        assert len(seen) == 1
    finally:
        store.close()


# -- PostgreSQL: connections killed, connections refused ---------------------------------------


def _terminate(dbname: str) -> int:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return len(rows)


@contextlib.contextmanager
def killing(dbname: str, every_s: float) -> Iterator[list[int]]:
    """Terminates every connection to ``dbname`` every ``every_s`` while inside; yields
    the number of connections killed per round."""
    rounds: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            rounds.append(_terminate(dbname))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield rounds
    finally:
        stop.set()
        thread.join()


async def test_runs_finish_while_their_connections_are_killed(pg_url: str) -> None:
    """A kill before a COMMIT is retried; one that cuts a COMMIT off (it may have landed)
    lets the run go, to be recovered (reconciled first) once stale. None fails."""
    downstream.set_world("lookup_ms", "30")
    engine = inprocess.engine(pg_url, script_name="work", heartbeat_timeout_s=1.0)
    try:
        runs = [await engine.start_run("dana", f"run {i}") for i in range(6)]
        with killing(pg_url.rsplit("/", 1)[1], 0.1) as killed:
            outcomes = await asyncio.gather(*(engine.run_until_stop(r.id) for r in runs))
        assert sum(killed) > 0, "no connection was killed: the test proved nothing"
        assert {o.kind for o in outcomes} <= {StopKind.ANSWERED, StopKind.ABANDONED}
        for run_id in [o.run_id for o in outcomes if o.kind is StopKind.ABANDONED]:
            await asyncio.to_thread(
                poll_until,
                functools.partial(
                    heartbeats.stale, engine.runner.store, run_id, 1.0, reconnects=True
                ),
                timeout=30,
            )
        await engine.runner.recover_orphans()
        finals = [await engine.run_until_stop(r.id) for r in runs]
    finally:
        engine.close()
    assert [f.kind for f in finals] == [StopKind.ANSWERED] * 6
    assert len(downstream.effects()) == 6  # each run's deduplicating write: once per key


def _allow_connections(dbname: str, allow: bool) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {dbname} WITH ALLOW_CONNECTIONS {str(allow).lower()}")


async def test_a_run_whose_database_stays_away_is_let_go_and_finished_after(
    pg_url: str,
) -> None:
    dbname = pg_url.rsplit("/", 1)[1]
    downstream.set_world("lookup_ms", "400")
    engine = inprocess.engine(pg_url, script_name="work", db_retry_s=0.3, heartbeat_timeout_s=0.5)
    try:
        run = await engine.start_run("dana", "outage")
        carried = asyncio.create_task(engine.run_until_stop(run.id))
        working = Path(os.environ["KIT_EFFECTS_DB"] + ".working")
        await asyncio.to_thread(poll_until, working.exists, what="the lookup to start")
        _allow_connections(dbname, False)
        try:
            _terminate(dbname)
            outcome = await carried  # the lookup's result cannot be stored
        finally:
            _allow_connections(dbname, True)
        assert outcome.kind is StopKind.ABANDONED

        downstream.set_world("lookup_ms", "0")
        view = await engine.get_run(run.id)
        assert view.run.state is RunState.RUNNING  # never failed for it
        reaper = inprocess.engine(pg_url, script_name="work", heartbeat_timeout_s=0.5)
        try:
            await asyncio.to_thread(
                poll_until,
                lambda: heartbeats.stale(engine.runner.store, run.id, 0.6, reconnects=True),
                what="the run to go stale",
            )
            recovered = await reaper.runner.recover_orphans()
            assert [o.run_id for o in recovered] == [run.id]
            final = await reaper.run_until_stop(run.id)
        finally:
            reaper.close()
        assert final.kind is StopKind.ANSWERED
        assert (await engine.get_run(run.id)).run.fail_reason is None
    finally:
        engine.close()


# -- approvals and reconciliation ------------------------------------------------------------

_GATE: dict[str, Any] = {}


def _slow_guard(args: Any, scope: Scope, ctx: ToolContext) -> Any:
    from tether import GuardResult

    started: threading.Event | None = _GATE.get("guard_started")
    release: threading.Event | None = _GATE.get("guard_release")
    if started is not None and release is not None:
        started.set()
        release.wait(30)
    return GuardResult.allow()


def _reconcile(key: str, ctx: ToolContext) -> Reconciled:
    down = _GATE.get("unreachable", 0)
    _GATE["asked"] = _GATE.get("asked", 0) + 1
    if down and _GATE["asked"] <= down:
        raise ConnectionError("the downstream is down")
    found = downstream.effects(key)
    return Reconciled.found({"item": found[0][2]}) if found else Reconciled.absent()


@tool(
    effect="write",
    needs_confirmation=True,
    reconcile=_reconcile,
    preview=lambda args, scope: {"item": args.item},
    guard=_slow_guard,
)
def transfer(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A confirmed write whose response may be lost after it committed
    (``downstream.inject_failure("transfer", "after_commit")``)."""
    return downstream.write_effect(ctx, "transfer", item)


def _agent() -> Agent:
    return Agent(
        name="faults",
        system_prompt="test",
        tools=(transfer,),
        resolve_scope=agents.resolve,
    )


@pytest.fixture
def gate() -> Iterator[dict[str, Any]]:
    _GATE.clear()
    yield _GATE
    release = _GATE.get("guard_release")
    if isinstance(release, threading.Event):
        release.set()
    _GATE.clear()


_TRANSFER: list[dict[str, Any]] = [
    {"tool_calls": [call("transfer", item="t")]},
    {"content": "done"},
]


async def test_an_approval_that_loses_its_run_says_the_decision_continues_elsewhere(
    db_url: str, gate: dict[str, Any]
) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine_for(
        db_url, _agent(), _TRANSFER, notifier=notifier, heartbeat_timeout_s=30
    )
    try:
        suspended = await engine.ask("dana", "transfer")
        assert suspended.kind is StopKind.SUSPENDED
        gate["guard_started"], gate["guard_release"] = threading.Event(), threading.Event()
        approving = asyncio.create_task(
            engine.resume_after_confirmation(notifier.last().token, "approve", "dana")
        )
        await asyncio.to_thread(gate["guard_started"].wait, 30)
        # Another process takes the run over while the request re-checks it.
        taken, _ = engine.runner.store.claim_orphans(
            owner="thief", stale_after_s=-1, max_attempts=9, batch=5
        )
        assert [r.id for r in taken] == [suspended.run_id]
        gate["guard_release"].set()
        result = await approving
        assert result.ok
        assert result.outcome is CallVerdict.CONTINUES_ELSEWHERE
        assert downstream.effects() == []  # the request started no tool after losing the run

        # The owner that took the run over carries the recorded decision out.
        gate.pop("guard_started")
        recovered = await engine.runner.recover(taken[0])
        assert recovered.kind is StopKind.RELEASED
        assert [e[1] for e in downstream.effects()] == ["transfer"]
    finally:
        engine.close()


async def test_reconcile_waits_for_a_downstream_it_cannot_reach(
    db_url: str, gate: dict[str, Any]
) -> None:
    gate.update(unreachable=2)
    downstream.inject_failure("transfer", "after_commit")
    notifier = MemoryNotifier()
    engine = inprocess.engine_for(
        db_url, _agent(), _TRANSFER, notifier=notifier, reconcile_patience_s=30
    )
    try:
        suspended = await engine.ask("dana", "transfer")
        result = await engine.resume_after_confirmation(notifier.last().token, "approve", "dana")
        assert gate["asked"] == 3  # two lookups failed, the third found the write
        assert result.outcome is CallVerdict.EXECUTED
        assert result.state is RunState.RUNNING
        assert [e[1] for e in downstream.effects()] == ["transfer"]
        messages = (await engine.get_run(suspended.run_id)).messages
        assert messages[-1]["role"] == "tool"
        assert json.loads(messages[-1]["content"]) == {"item": "t"}
    finally:
        engine.close()


async def test_a_downstream_unreachable_past_the_patience_fails_the_run_and_says_so(
    db_url: str, gate: dict[str, Any]
) -> None:
    gate.update(unreachable=10_000)
    downstream.inject_failure("transfer", "after_commit")
    notifier = MemoryNotifier()
    engine = inprocess.engine_for(
        db_url, _agent(), _TRANSFER, notifier=notifier, reconcile_patience_s=0.6
    )
    try:
        suspended = await engine.ask("dana", "transfer")
        result = await engine.resume_after_confirmation(notifier.last().token, "approve", "dana")
        assert gate["asked"] >= 2  # asked again before giving up
        assert result.outcome is CallVerdict.UNRECONCILABLE
        assert result.state is RunState.FAILED
        run = (await engine.get_run(suspended.run_id)).run
        assert run.fail_reason == "unreconcilable"
    finally:
        engine.close()


# -- notices ---------------------------------------------------------------------------------


class HungNotifier:
    """A webhook that accepts and never answers."""

    def __init__(self) -> None:
        self.sent: list[Notice] = []
        self.never = asyncio.Event()

    async def send(self, notice: Notice) -> bool:
        self.sent.append(notice)
        await self.never.wait()
        return True


@pytest.mark.slow
async def test_a_hung_notifier_holds_up_no_run(db_url: str) -> None:
    notifier = HungNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    answering = inprocess.engine(db_url, script_name="answer", notifier=notifier)
    try:
        suspended = await asyncio.wait_for(engine.ask("dana", "send"), timeout=30)
        answered = await asyncio.wait_for(answering.ask("dana", "answer"), timeout=30)
        assert suspended.kind is StopKind.SUSPENDED
        assert answered.kind is StopKind.ANSWERED
        await asyncio.to_thread(poll_until, lambda: notifier.sent, what="the notice")
        assert engine.runner.services.outbox.pending == 0  # taken by a sender, which waits
        with engine.runner.store.engine.connect() as conn:
            notified = conn.execute(
                sa.text("SELECT notified_at FROM runs WHERE id = :id"), {"id": suspended.run_id}
            ).scalar_one()
        assert notified is None  # undelivered: the reaper re-issues it
    finally:
        engine.runner.services.outbox.timeout_s = 0.01
        await engine.aclose()
        await answering.aclose()


# -- a step write whose COMMIT is cut off after it landed --------------------------------------

# The "work" script's step writes, in order: a read-only step (turn and result), a write's
# turn with its intent, that write's result, the final answer.
STEP_WRITES = ["read step", "write's turn", "write's result", "answer"]


@pytest.mark.parametrize("cut_at", range(len(STEP_WRITES)), ids=STEP_WRITES)
async def test_a_step_write_cut_off_after_its_commit_landed_is_retried_and_applied_once(
    pg_url: str, cut_at: int
) -> None:
    """The connection drops right after the server committed a step write, before the
    answer reached us (a real TCP cut). The write is tried again; the message count it
    is conditional on has moved, so the retry changes nothing and finds its own landing:
    no message, counter or effect is doubled, and the run goes on."""
    base, _, dbname = pg_url.rpartition("/")
    with pgproxy.proxy() as cutter:
        url = f"{base.rsplit('@', 1)[0]}@127.0.0.1:{cutter.port}/{dbname}"
        engine = inprocess.engine(url, script_name="work", db_retry_s=10.0)
        step_writes: list[str] = []

        @sa.event.listens_for(engine.runner.store.engine, "before_cursor_execute")
        def spot(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            if statement.lstrip().startswith("WITH r AS"):
                step_writes.append(statement)
                if len(step_writes) == cut_at + 1:
                    cutter.arm()

        try:
            outcome = await engine.ask("dana", "go")
            view = await engine.get_run(outcome.run_id)
            ledger = await engine.ledger(outcome.run_id)
        finally:
            engine.close()
    assert cutter.cuts == 1, "no COMMIT was cut off: the test proved nothing"
    assert len(step_writes) == len(STEP_WRITES) + 1  # the cut write was sent twice
    assert outcome.kind is StopKind.ANSWERED
    roles = [m["role"] for m in view.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    budget = view.run.budget
    assert (budget.steps, budget.tool_calls) == (3, 2)
    assert [(e.tool, e.status.value) for e in ledger] == [("lookup", "ok"), ("record", "ok")]
    assert [tool for _, tool, _ in downstream.effects()] == ["record"]


# -- a claim whose COMMIT is cut off ---------------------------------------------------------


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "never-arrived"])
async def test_a_claim_cut_off_at_its_commit_is_settled_by_the_transactions_fate(
    pg_url: str, lands: bool
) -> None:
    """A worker's claim whose COMMIT lost its answer (a real TCP cut) is settled at once
    by asking PostgreSQL the transaction's fate (``txid_status``), rather than left for a
    reaper a heartbeat timeout later: landed, the claim stands and the worker has its
    runs; never arrived, it is tried again. Either way each run is claimed exactly once
    and the caller sees no error."""
    base, _, dbname = pg_url.rpartition("/")
    with pgproxy.proxy() as cutter:
        url = f"{base.rsplit('@', 1)[0]}@127.0.0.1:{cutter.port}/{dbname}"
        engine = inprocess.engine(url, db_retry_s=10.0)
        store = engine.runner.store
        claims: list[str] = []

        @sa.event.listens_for(store.engine, "before_cursor_execute")
        def spot(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            # The claim's UPDATE, its pick written before it as CTEs (``WITH ...``).
            if "UPDATE runs" in statement and "txid_current" in statement:
                claims.append(statement)
                if len(claims) == 1:
                    cutter.arm(lands=lands)

        try:
            ids = {(await engine.start_run("dana", f"q{i}")).id for i in range(3)}
            claimed = await hop(store.claim_waiting, "w1", 5)
        finally:
            engine.close()
    assert cutter.cuts == 1, "no COMMIT was cut off: the test proved nothing"
    assert len(claims) == (1 if lands else 2)  # settled as landed, or tried again
    assert {run.id for run in claimed} == ids
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT owner, lease_epoch FROM runs").fetchall()
    assert sorted(rows) == [("w1", 1)] * 3  # each claimed once, by w1


async def test_a_pooled_connection_that_died_while_idle_costs_one_retry(pg_url: str) -> None:
    """No pre-ping before each transaction: a connection the server dropped while it sat
    in the pool fails at its first statement (nothing was committed), and the call is
    tried again on a fresh connection."""
    store = Store(pg_url, retry_s=10.0)
    errors: list[bool] = []
    try:
        await hop(store.add_user, "erin", "key-of-erin-0123456789")
        assert _terminate(pg_url.rsplit("/", 1)[1]) >= 1  # the pooled connection, idle
        sa.event.listen(store.engine, "handle_error", lambda ctx: errors.append(ctx.is_disconnect))
        await hop(store.add_user, "finn", "key-of-finn-0123456789")
        assert store.user_for_key("key-of-finn-0123456789") == "finn"
    finally:
        store.close()
    assert errors == [True], "the dead connection was not used: the test proved nothing"
