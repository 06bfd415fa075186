"""Fair claims without a cap (reference §13), on both backends: among waiting runs of equal
priority a claim takes the run of the user carrying the fewest runs, the oldest first
among those; a batch spreads the same way, counting the runs it takes itself; priority
still comes first. Through the store, each claim's order asserted (no timing)."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from store_runs import (
    BULK_ROW,
    claim_ids,
    new_run,
    stored_heads,
    stored_load,
    true_heads,
    true_load,
)

from tether.store import Store
from tether.store.sql.fair_pick import pick_sizes
from tether.store.sql.schema import runs


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store(db_url)
    yield opened
    opened.close()


# Runs made here wait since a past second of their own: from 1,000 s ago, one a second.
_PAST = 1000.0


def _new(store: Store, *users: str, **order: Any) -> list[str]:
    """New runs of ``users`` in turn, each a second younger than the one before (and all
    older than now), so that no two ages tie: SQLite's clock counts milliseconds, and runs
    are made faster than that."""
    made = [new_run(store, user, **order) for user in users]
    now = store.now()
    aged = sa.select(sa.func.max(runs.c.updated_at)).where(runs.c.updated_at < now - _PAST / 2)
    with store.begin() as conn:
        latest = conn.execute(aged).scalar() or now - _PAST
        for offset, run_id in enumerate(made, start=1):
            conn.execute(
                runs.update().where(runs.c.id == run_id).values(updated_at=latest + offset)
            )
    return made


def _carry(store: Store, user: str, n: int) -> None:
    """Give ``user`` ``n`` runs carried by another worker."""
    for run_id in _new(store, *[user] * n):
        assert store.claim_ready("elsewhere", run_id) is not None


def _batch(store: Store, limit: int) -> set[str]:
    return {run.id for run in store.claim_waiting("w", limit)}


def test_one_users_backlog_does_not_keep_another_users_run_waiting(store: Store) -> None:
    *backlog, late = _new(store, "ana", "ana", "ana", "ana", "bo")  # bo's arrives last
    # ana's first, then bo's (bo carries none, ana one), then ana's in order.
    assert claim_ids(store, 6) == [backlog[0], late, *backlog[1:], None]
    assert stored_load(store) == true_load(store)


def test_among_equal_loads_the_oldest_run_goes_first(store: Store) -> None:
    _carry(store, "ana", 1)
    _carry(store, "bo", 1)
    bo, ana = _new(store, "bo", "ana")
    assert claim_ids(store, 3) == [bo, ana, None]


def test_a_batch_spreads_across_users_counting_the_runs_it_takes(store: Store) -> None:
    _carry(store, "ana", 1)
    made = _new(store, *["ana"] * 5, *["bo"] * 3, "cy")
    ana, bo, cy = made[:5], made[5:8], made[8]
    # One claim at a time would take: bo's first (bo and cy carry none, bo's is older),
    # cy's, then ana's (ana and bo at one each, ana's older), bo's, ana's (both at two).
    assert _batch(store, 5) == {bo[0], cy, ana[0], bo[1], ana[1]}
    assert _batch(store, 5) == {bo[2], *ana[2:]}
    assert stored_load(store) == true_load(store) == {"ana": (6, 0), "bo": (3, 0), "cy": (1, 0)}


def test_priority_comes_before_the_users_load(store: Store) -> None:
    _carry(store, "ana", 2)
    (plain,) = _new(store, "bo")
    urgent = _new(store, "ana", "ana", priority=1)
    (low,) = _new(store, "cy", priority=-1)
    assert claim_ids(store, 5) == [*urgent, plain, low, None]
    assert _batch(store, 4) == set()


def test_a_queued_run_whose_time_came_is_ranked_by_its_users_load(store: Store) -> None:
    _carry(store, "ana", 1)
    ana = _new(store, "ana", "ana")
    later = new_run(store, "bo", start_at=4102444800.0)  # 2100: queued
    now = store.now()
    with store.begin() as conn:  # its time comes now, after ana's runs became ready
        conn.execute(runs.update().where(runs.c.id == later).values(start_at=now))
    assert claim_ids(store, 3) == [later, *ana]


@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("why", ["version", "delayed"])
@pytest.mark.parametrize("limit", [1, 3])
def test_users_whose_first_runs_cannot_be_claimed_now_are_passed_over(
    store: Store, limit: int, why: str, many: bool
) -> None:
    # Users whose first run the claim cannot take now (of a version not served, or held
    # back by a delay), a few or more than the claim reads first (then every user is
    # compared), ahead of ana's, whose second run it can take, and bo's.
    blocked = _new(
        store, *[f"u{i:02d}" for i in range(pick_sizes(limit)["b_heads"] + 2 if many else 2)]
    )
    ana_first, ana_second, bo = _new(store, "ana", "ana", "bo")
    held = [*blocked, ana_first]
    change: dict[str, Any] = {"agent_version": "t@0"}
    if why == "delayed":
        change = {"ready_at": store.now() + 1e3}
    with store.begin() as conn:
        conn.execute(runs.update().where(runs.c.id.in_(held)).values(**change))
    taken = store.claim_waiting("w", limit, versions=["t@1"])
    # ana's second run and bo's: both users carry none, ana's is older.
    assert [run.id for run in taken] == [ana_second, bo][:limit]
    assert stored_heads(store) == true_heads(store)
    assert stored_heads(store)["ana"][2] == ana_first  # still the first that waits


def test_a_user_whose_ready_runs_are_of_another_version_is_passed_over(store: Store) -> None:
    ana, bo = _new(store, "ana", "bo")
    with store.begin() as conn:
        conn.execute(runs.update().where(runs.c.id == ana).values(agent_version="t@0"))
    taken = store.claim_waiting("w", 4, versions=["t@1"])
    assert [run.id for run in taken] == [bo]
    with store.engine.connect() as conn:
        owner = conn.execute(sa.select(runs.c.owner).where(runs.c.id == ana)).scalar()
    assert owner is None


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_concurrent_batch_claims_take_each_run_once(store: Store) -> None:
    ids = set(_new(store, *["ana", "bo", "cy"] * 30))
    start = threading.Barrier(6)
    taken: list[str] = []

    def claimer(worker: int) -> None:
        start.wait()
        for _ in range(8):
            taken.extend(run.id for run in store.claim_waiting(f"w{worker}", 4))

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    while rest := store.claim_waiting("w", 32):  # what the racing claims left
        taken.extend(run.id for run in rest)
    assert Counter(taken) == Counter(ids)
    assert stored_load(store) == true_load(store) == {"ana": (30, 0), "bo": (30, 0), "cy": (30, 0)}


def _one_at_a_time(
    ready: list[tuple[str, str, int, float]], load: dict[str, int], n: int
) -> set[str]:
    """What ``n`` claims of one run each take of ``ready`` (id, user, priority, since), by the
    rule itself: the best priority, then the user carrying fewest, then the oldest."""
    waiting = sorted(ready, key=lambda r: (-r[2], r[3], r[0]))
    load = dict(load)
    taken: set[str] = set()
    for _ in range(n):
        heads: dict[str, tuple[str, str, int, float]] = {}
        for run in waiting:
            heads.setdefault(run[1], run)
        if not heads:
            break
        run = min(heads.values(), key=lambda r: (-r[2], load[r[1]], r[3], r[0]))
        waiting.remove(run)
        load[run[1]] += 1
        taken.add(run[0])
    return taken


@pytest.mark.parametrize("seed", range(12))
def test_a_batch_takes_what_claims_of_one_run_each_would(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    users = [f"u{i}" for i in range(rng.randint(2, 10))]
    load = {user: rng.choice([0, 0, 1, 2, 5]) for user in users}
    for user, n in load.items():
        _carry(store, user, n)
    specs = [
        (user, rng.choice([0, 0, 0, 1, -1]))
        for user in users
        for _ in range(rng.choice([0, 1, 3, 40, 90] if seed % 2 else [1, 40, 90, 150]))
    ]
    if seed % 2:
        rng.shuffle(specs)  # the users' runs interleaved...
    else:  # ...or one user's after another's, the busiest first: past the cheap look
        specs.sort(key=lambda spec: -load[spec[0]])
    now = store.now()
    rows = [
        {**BULK_ROW, "id": uuid.uuid4().hex, "user_id": user, "priority": priority,
         "updated_at": now - 5000 + i}
        for i, (user, priority) in enumerate(specs)
    ]  # fmt: skip
    if rows:
        with store.begin() as conn:
            conn.execute(runs.insert(), rows)
    ready = [(r["id"], r["user_id"], r["priority"], r["updated_at"]) for r in rows]
    for limit in (1, 5, 32):
        expected = _one_at_a_time(ready, load, limit)
        taken = store.claim_waiting("w", limit)
        assert {run.id for run in taken} == expected, (seed, limit)
        for run in taken:
            load[run.user_id] += 1
        ready = [r for r in ready if r[0] not in expected]
