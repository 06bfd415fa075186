"""The store on both backends: the transition table it enforces on the rows, delayed
hand-back, orphan claims, snapshots, counts, users, and the partial indexes its scans use."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from store_runs import new_run
from waiting import poll_until

from tether.budget import Limits
from tether.errors import IllegalTransition, InvalidInput, LeaseLost
from tether.reasons import FailReason, HaltReason
from tether.runs import Lease, Pending, Run, RunState
from tether.store import Store, upkeep
from tether.store.reads import _COUNT_BY_STATE, page_of
from tether.store.sql import claims as claim_sql
from tether.store.sql.claim_order import pick_next
from tether.store.sql.fair_pick import pick_sizes
from tether.store.sql.schema import runs
from tether.store.sql.served import served
from tether.store.sql.transitions import Transition
from tether.store.users import hash_key


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store(db_url)
    yield opened
    opened.close()


def _claimed(store: Store, owner: str = "w1") -> Lease:
    run = store.claim_ready(owner, new_run(store))
    assert run is not None
    return run.lease()


def _row(store: Store, run_id: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        return dict(conn.execute(sa.select(runs).where(runs.c.id == run_id)).one()._mapping)


def _suspend(store: Store, lease: Lease, token_hash: str, call_id: str = "c1") -> None:
    pending = Pending(tool_call_id=call_id, tool="send", arguments={}, preview={}, digest="d")
    store.suspend(lease, calls=[(pending, token_hash)], ttl_s=600, elapsed_ms=1, event={})


# -- the transition table is the one enforced -------------------------------------------------


@pytest.mark.parametrize(
    ("reach", "src", "dst"),
    [
        ("answered", RunState.ANSWERED, RunState.RUNNING),
        ("cancelled", RunState.CANCELLED, RunState.SUSPENDED),
        ("halted", RunState.HALTED, RunState.SUSPENDED),
    ],
)
def test_an_illegal_transition_raises_and_leaves_the_row_unchanged(
    store: Store, reach: str, src: RunState, dst: RunState
) -> None:
    run_id = _reach(store, reach)
    before = _row(store, run_id)
    assert before["state"] == src.value
    with pytest.raises(IllegalTransition), store.engine.begin() as conn:
        Transition(src, dst, runs.c.id == run_id).one(conn)
    assert _row(store, run_id) == before


def _reach(store: Store, state: str) -> str:
    lease = _claimed(store)
    if state == "answered":
        message = {"role": "assistant", "content": "done"}
        store.persist_turn(
            lease,
            seq=1,
            message=message,
            spend_usd=0,
            elapsed_ms=1,
            intents=[],
            final=True,
            event={},
        )
    elif state == "cancelled":
        assert store.cancel(run_id=lease.run_id, user_id="dana", by="dana") is not None
    else:
        store.halt(lease, reason=HaltReason.MAX_STEPS, elapsed_ms=1, event={})
    return lease.run_id


def test_a_legal_transition_whose_state_moved_on_applies_to_nothing(store: Store) -> None:
    lease = _claimed(store)
    _suspend(store, lease, "h1")
    assert store.cancel(run_id=lease.run_id, user_id="dana", by="dana") is not None
    before = _row(store, lease.run_id)
    claim = store.claim_decision(
        run_id=lease.run_id, token_hash="h1", owner="w2", decision="approve", approver="dana"
    )
    assert claim.run is None and claim.decision is None
    assert (
        store.continue_halted(
            run_id=lease.run_id, user_id="dana", limits=Limits(), by="dana", why=None
        )
        is None
    )
    assert store.cancel(run_id=lease.run_id, user_id="dana", by="dana") is None
    assert _row(store, lease.run_id) == before


def test_halt_and_fail_store_the_reason_enums_values(store: Store) -> None:
    halted, failed = _claimed(store), _claimed(store)
    store.halt(halted, reason=HaltReason.NO_LONGER_PERMITTED, elapsed_ms=5, event={})
    store.fail(failed, reason=FailReason.UNRECONCILABLE, elapsed_ms=5, event={})
    assert _row(store, halted.run_id)["halt_reason"] == "no_longer_permitted"
    assert _row(store, failed.run_id)["fail_reason"] == "unreconcilable"
    with pytest.raises(LeaseLost):  # both already left running: the lease is gone
        store.halt(failed, reason=HaltReason.MAX_STEPS, elapsed_ms=5, event={})


# -- delayed hand-back ------------------------------------------------------------------------


def test_a_run_released_with_a_delay_is_not_claimable_before_it(store: Store) -> None:
    lease = _claimed(store)
    store.release(lease, elapsed_ms=3, event={"why": "retry"}, delay_s=3600, kind="model_retry")
    assert store.claim_ready("w2") is None
    assert store.claim_ready("w2", lease.run_id) is None
    assert [e.kind for e in store.events(lease.run_id)][-1] == "model_retry"
    assert _row(store, lease.run_id)["ready_at"] > store.now() + 3000


def test_a_delayed_run_becomes_claimable_by_the_database_clock(store: Store) -> None:
    lease = _claimed(store)
    store.release(lease, elapsed_ms=3, delay_s=0.2)
    ready_at = _row(store, lease.run_id)["ready_at"]
    claimed = poll_until(lambda: store.claim_ready("w2"), what="the delayed run")
    assert isinstance(claimed, Run) and claimed.id == lease.run_id
    assert store.now() >= ready_at
    assert _row(store, lease.run_id)["ready_at"] is None  # cleared by the claim


def test_a_release_without_delay_is_claimable_at_once(store: Store) -> None:
    lease = _claimed(store)
    store.release(lease, elapsed_ms=3)
    assert _row(store, lease.run_id)["ready_at"] is None
    claimed = store.claim_ready("w2")
    assert claimed is not None and claimed.lease_epoch == lease.epoch + 1


# -- orphans ----------------------------------------------------------------------------------


def _orphan(store: Store, count: int) -> list[str]:
    ids = [_claimed(store, "dead").run_id for _ in range(count)]
    with store.engine.begin() as conn:  # the dead owner's heartbeat is long past
        conn.execute(sa.update(runs).where(runs.c.id.in_(ids)).values(heartbeat_at=1.0))
    return ids


def test_concurrent_reapers_claim_each_orphan_exactly_once(store: Store) -> None:
    ids = _orphan(store, 12)
    claimed: list[str] = []
    lock = threading.Lock()

    def reap(owner: str) -> None:
        while True:
            got, exhausted = store.claim_orphans(
                owner=owner, stale_after_s=600, max_attempts=5, batch=2
            )
            assert exhausted == []
            if not got:
                return
            with lock:
                claimed.extend(run.id for run in got)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(reap, [f"reaper-{i}" for i in range(4)]))
    assert sorted(claimed) == sorted(ids)
    assert {_row(store, run_id)["recovery_attempts"] for run_id in ids} == {1}


def test_an_orphan_past_its_attempts_fails_and_a_fresh_run_is_left_alone(store: Store) -> None:
    (orphan,) = _orphan(store, 1)
    live = _claimed(store, "alive")
    got, exhausted = store.claim_orphans(owner="r", stale_after_s=600, max_attempts=0, batch=5)
    assert got == [] and exhausted == [orphan]
    assert _row(store, orphan)["fail_reason"] == FailReason.RECOVERY_EXHAUSTED.value
    assert _row(store, live.run_id)["owner"] == "alive"


# -- snapshot, counts, readiness --------------------------------------------------------------


def test_the_snapshot_carries_the_decision_of_the_current_token_only(store: Store) -> None:
    lease = _claimed(store)
    snap = store.snapshot(lease.run_id)
    assert snap is not None and snap.decisions == {} and snap.messages[0]["content"] == "q"
    _suspend(store, lease, "h1")
    resumed = store.claim_decision(
        run_id=lease.run_id, token_hash="h1", owner="w2", decision="approve", approver="dana"
    ).run
    assert resumed is not None
    snap = store.snapshot(lease.run_id)
    assert snap is not None and list(snap.decisions) == ["c1"]
    assert (snap.decisions["c1"].tool_call_id, snap.decisions["c1"].decision) == ("c1", "approve")
    _suspend(store, resumed.lease(), "h2")  # re-suspended: the earlier approval is spent
    snap = store.snapshot(lease.run_id)
    assert snap is not None and snap.decisions == {}
    assert store.snapshot("missing") is None


def test_counts_by_state_name_every_state(store: Store) -> None:
    assert store.count_by_state() == {state.value: 0 for state in RunState}
    _claimed(store)
    new_run(store)
    _reach(store, "cancelled")
    counts = store.count_by_state()
    assert set(counts) == {state.value for state in RunState}
    assert (counts["running"], counts["cancelled"], counts["answered"]) == (2, 1, 0)


def test_the_dialect_names_its_backend_and_how_workers_wake(store: Store) -> None:
    store.ping()
    assert store.dialect.name == store.engine.dialect.name
    assert store.dialect.notifies is (store.dialect.name == "postgresql")
    dsn = store.listen_dsn()
    if store.dialect.notifies:
        assert dsn is not None and dsn.startswith("postgresql://")
    else:
        assert dsn is None


def test_ping_raises_when_the_database_is_unreachable() -> None:
    store = Store("postgresql://nobody@127.0.0.1:1/nothing")
    with pytest.raises(sa.exc.OperationalError):
        store.ping()
    store.close()


# -- users ------------------------------------------------------------------------------------


def test_adding_a_user_is_race_free_and_idempotent(store: Store) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: store.add_user("ana", "k-ana"), range(8)))
    assert store.user_for_key("k-ana") == "ana"
    store.add_user("ana", "k-ana-2")
    assert store.user_for_key("k-ana-2") == "ana"


def test_a_key_of_another_user_is_refused_and_writes_nothing(store: Store) -> None:
    store.add_user("ana", "k-ana")
    with pytest.raises(InvalidInput, match="belongs to another user"):
        store.add_user("eve", "k-ana")
    with store.engine.connect() as conn:
        users = conn.execute(sa.text("SELECT id FROM users")).scalars().all()
        keys = conn.execute(sa.text("SELECT key_hash FROM api_keys")).scalars().all()
    assert users == ["ana"] and keys == [hash_key("k-ana")]


@pytest.mark.parametrize("key", ["", "x" * 513, "bad \ud800"])
def test_a_malformed_key_resolves_to_nobody_and_cannot_be_added(store: Store, key: str) -> None:
    assert store.user_for_key(key) is None
    with pytest.raises(InvalidInput):
        store.add_user("ana", key)


# -- partial indexes --------------------------------------------------------------------------

# The scans that claim take only the versions served (reference §12): one, as a worker has.
_ONE = served(["t@1"])
_CLAIM = {"b_cap": None, **_ONE, **pick_sizes(1)}
SCANS: dict[str, tuple[Any, dict[str, Any], str | tuple[str, ...]]] = {
    # The users with ready runs in the order of their first ones, then a user's own runs.
    "users with ready runs": (
        lambda d: pick_next(type(d), capped=False),
        _CLAIM,
        "user_load_heads",
    ),
    "ready runs": (lambda d: pick_next(type(d), capped=False), _CLAIM, "runs_ready_user"),
    "queued runs": (lambda d: pick_next(type(d), capped=False), _CLAIM, "runs_queued"),
    "starting runs": (lambda d: pick_next(type(d), capped=False), _CLAIM, "runs_starting"),
    "ready runs per user": (
        lambda d: pick_next(type(d), capped=True),
        {**_CLAIM, "b_cap": 2},
        # Through a user's own ready runs, or (as PostgreSQL's planner may judge cheaper
        # by the statistics an earlier test left on a pooled database) the ready runs.
        ("runs_ready_user", "runs_ready"),
    ),
    "orphans": (
        claim_sql.ORPHANS,
        {"b_stale": 10.0, "b_batch": 5, **_ONE},
        "runs_orphan_scan",
    ),
    "expired": (upkeep._EXPIRED, {"b_batch": 5, **_ONE}, "runs_suspended_expiry"),
    "unnotified": (
        upkeep._UNNOTIFIED,
        {"b_older": 1.0, "b_batch": 5, **_ONE},
        "runs_unnotified",
    ),
    "retention": (upkeep._PAST_RETENTION, {"b_retention": 1.0, "b_batch": 5}, "runs_retention"),
    "counts": (_COUNT_BY_STATE, {}, "runs_state"),
    # A page of a user's top-level runs (reference §18): children are left out by a plain
    # column test, and the user's index still serves the page.
    "a user's runs": (page_of("dana", None, None, 10), {}, "runs_user"),
}


@pytest.mark.parametrize("scan", sorted(SCANS))
def test_each_scan_of_the_store_uses_its_index(store: Store, scan: str) -> None:
    statement, params, index = SCANS[scan]
    if callable(statement):  # built for the store's dialect
        statement = statement(store.dialect)
    for _ in range(20):
        _reach(store, "cancelled")  # finished runs the scans must not read
    plan = _plan(store, statement, params)
    wanted = (index,) if isinstance(index, str) else index
    assert any(name in plan for name in wanted), plan
    assert "Seq Scan on runs " not in plan, plan  # never the whole table (PostgreSQL)


def _plan(store: Store, statement: Any, params: dict[str, Any]) -> str:
    sql = str(
        statement.params(**params).compile(
            dialect=store.engine.dialect, compile_kwargs={"literal_binds": True}
        )
    )
    with store.engine.connect() as conn:
        if store.dialect.name == "sqlite":
            return "\n".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        # Tiny tables make a sequential scan cheapest; what matters is that the index can
        # serve the query.
        conn.exec_driver_sql("SET enable_seqscan = off")
        return "\n".join(str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + sql))
