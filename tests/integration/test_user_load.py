"""``user_load`` (reference §13) agrees with the runs after every kind of change, on
both backends: each user's carried and waiting runs, and the first of those in the claim's
order (its head, which the fair claim reads instead of the runs). Random changes, seeded,
through the store's own claims and cancels and through plain SQL (inserts, multi-row
updates of state, owner, priority, age, version and delay, deletes), each compared with a
recount."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from store_runs import BULK_ROW, new_run, stored_heads, stored_load, true_heads, true_load

from tether.store import Store
from tether.store.sql.schema import runs

_USERS = ("ana", "bo", "cy", "dee")
# Few ages, so runs tie on priority and age and the head is told apart by its id.
_AGES = (1000.0, 1001.0, 1002.0)
# (state, owner) a run is put in: waiting, carried, and neither.
_PLACES = (("running", None), ("running", "w1"), ("suspended", None), ("halted", None))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = Store(db_url)
    yield opened
    opened.close()


def _some(rng: random.Random, store: Store) -> list[str]:
    """A random few of the runs (none when there are none)."""
    with store.engine.connect() as conn:
        ids = sorted(conn.execute(sa.select(runs.c.id)).scalars())
    return rng.sample(ids, min(len(ids), rng.randint(1, 4)))


def _insert(rng: random.Random, store: Store) -> None:
    rows = []
    for _ in range(rng.randint(1, 4)):
        state, owner = rng.choice(_PLACES)
        rows.append(
            {**BULK_ROW, "id": uuid.uuid4().hex, "user_id": rng.choice(_USERS), "state": state,
             "owner": owner, "priority": rng.choice([-1, 0, 1]), "updated_at": rng.choice(_AGES)}
        )  # fmt: skip
    with store.begin() as conn:
        conn.execute(runs.insert(), rows)


def _update(rng: random.Random, store: Store) -> None:
    """One UPDATE of a few runs: a new place, priority, age, version or delay (or several)."""
    changes: dict[str, Any] = {}
    if rng.random() < 0.6:
        changes["state"], changes["owner"] = rng.choice(_PLACES)
    if rng.random() < 0.4:
        changes["priority"] = rng.choice([-1, 0, 1])
    if rng.random() < 0.2:
        changes["agent_version"] = rng.choice(["t@1", "t@0"])
    if rng.random() < 0.2:
        changes["ready_at"] = rng.choice([None, 5000.0])
    if rng.random() < 0.4 or not changes:
        changes["updated_at"] = rng.choice(_AGES)
    ids = _some(rng, store)
    with store.begin() as conn:
        conn.execute(runs.update().where(runs.c.id.in_(ids)).values(**changes))


def _delete(rng: random.Random, store: Store) -> None:
    ids = _some(rng, store)
    with store.begin() as conn:
        conn.execute(runs.delete().where(runs.c.id.in_(ids)))


def _claim(rng: random.Random, store: Store) -> None:
    versions = rng.choice([None, ["t@1"]])
    store.claim_waiting(f"w{rng.randint(1, 3)}", rng.choice([1, 2, 5]), versions=versions)


def _cancel(rng: random.Random, store: Store) -> None:
    ids = _some(rng, store)
    with store.engine.connect() as conn:
        picked = conn.execute(sa.select(runs.c.id, runs.c.user_id).where(runs.c.id.in_(ids)))
        owned = picked.all()
    for run_id, user in owned:
        store.cancel(run_id=run_id, user_id=user, by=user)


def _create(rng: random.Random, store: Store) -> None:
    new_run(store, rng.choice(_USERS), priority=rng.choice([-1, 0, 1]))


_CHANGES = (_insert, _update, _update, _delete, _claim, _cancel, _create)


@pytest.mark.parametrize("seed", range(4))
def test_the_counts_and_heads_agree_with_the_runs_after_every_change(
    store: Store, seed: int
) -> None:
    rng = random.Random(seed)
    for step in range(60):
        change = rng.choice(_CHANGES)
        change(rng, store)
        assert stored_load(store) == true_load(store), (seed, step, change.__name__)
        assert stored_heads(store) == true_heads(store), (seed, step, change.__name__)


def test_a_step_of_a_carried_run_writes_nothing_to_user_load(store: Store) -> None:
    carried = new_run(store, "ana")
    assert store.claim_ready("w1", carried) is not None
    waiting = new_run(store, "ana")
    # What a step writes of its run (its age and counters), and the rows that statement
    # wrote with its triggers: SQLite counts them (``total_changes``); on PostgreSQL a row
    # written again is a new version of it (``xmin``).
    step = runs.update().where(runs.c.id == carried).values(updated_at=1.0, step=runs.c.step + 1)
    version = sa.text("SELECT xmin::text FROM user_load WHERE user_id = 'ana'")
    with store.begin() as conn:
        if store.dialect.name == "sqlite":
            raw: Any = conn.connection.driver_connection
            before = raw.total_changes
            conn.execute(step)
            assert raw.total_changes - before == 1  # the run's row alone
        else:
            before = conn.execute(version).scalar()
            conn.execute(step)
            assert conn.execute(version).scalar() == before
    assert stored_heads(store)["ana"][2] == waiting
    assert stored_load(store) == true_load(store) == {"ana": (1, 1)}
