"""Runs written straight to a store, for the tests beneath the engine: a ready run of a
user, the runs a number of workers claim one after another, and the users' load
(``user_load``: counts and first waiting runs) beside what it should be, counted from
the runs themselves."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from tether.budget import Limits
from tether.store import Store
from tether.store.sql.schema import runs, user_load


def new_run(store: Store, user: str = "dana", **order: Any) -> str:
    """A ready run of ``user`` (``order``: its ``priority``, ``start_at``), its id."""
    run_id = uuid.uuid4().hex
    store.create_run(
        run_id=run_id,
        user_id=user,
        question="q",
        route={},
        limits=Limits(),
        scope={},
        versions={},
        agent_version="t@1",
        messages=[{"role": "user", "content": "q"}],
        **order,
    )
    return run_id


# A ready run's row for runs inserted in bulk (``runs.insert()``, which the triggers count
# as ``create_run``'s): each caller adds its ``id`` and ``user_id``, and may change the rest.
BULK_ROW: dict[str, Any] = {
    "question": "q",
    "route": {},
    "state": "running",
    "max_steps": 10,
    "max_spend_usd": 1.0,
    "max_tool_calls": 10,
    "max_elapsed_ms": 60_000,
    "scope_snapshot": {},
    "scope_resolved_at": 0.0,
    "versions": {},
    "agent_version": "t@1",
    "started_at": 0.0,
}


def claim_ids(store: Store, n: int, **kwargs: Any) -> list[str | None]:
    """The ids of the runs ``n`` workers claim one after another (None: nothing left)."""
    taken = [store.claim_ready(f"w{i}", **kwargs) for i in range(n)]
    return [run.id if run else None for run in taken]


def stored_load(store: Store) -> dict[str, tuple[int, int]]:
    """``user_load`` as stored: each user's runs carried and ready, where not both 0."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(user_load)).all()
    return {r.user_id: (r.carried, r.ready) for r in rows if (r.carried, r.ready) != (0, 0)}


def true_load(store: Store) -> dict[str, tuple[int, int]]:
    """What ``user_load`` should say, counted from the runs themselves."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(runs.c.user_id, runs.c.state, runs.c.owner)).all()
    counts: dict[str, list[int]] = {}
    for r in rows:
        seen = counts.setdefault(r.user_id, [0, 0])
        if r.state == "running":
            seen[0 if r.owner else 1] += 1
    return {user: (c[0], c[1]) for user, c in counts.items() if c != [0, 0]}


# A user's first waiting run: priority, since when it waits, id, version, delay.
Head = tuple[int, float, str, str, float | None]


def stored_heads(store: Store) -> dict[str, Head]:
    """Each user's first waiting run as ``user_load`` keeps it."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(user_load).where(user_load.c.head_id.is_not(None))).all()
    return {
        r.user_id: (r.head_priority, r.head_since, r.head_id, r.head_version, r.head_ready_at)
        for r in rows
    }


def true_heads(store: Store) -> dict[str, Head]:
    """What ``user_load``'s heads should say: each user's first run that waits for a worker
    (running, no owner) by priority, then age, then id, as the database orders them."""
    waiting = runs.c.state == "running", runs.c.owner.is_(None)
    first = sa.func.row_number().over(
        partition_by=runs.c.user_id,
        order_by=(runs.c.priority.desc(), runs.c.updated_at, runs.c.id),
    )
    copied = (runs.c.priority, runs.c.updated_at, runs.c.id, runs.c.agent_version, runs.c.ready_at)
    ranked = sa.select(runs.c.user_id, *copied, first.label("n")).where(*waiting).subquery()
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(ranked).where(ranked.c.n == 1)).all()
    return {r.user_id: (r.priority, r.updated_at, r.id, r.agent_version, r.ready_at) for r in rows}
