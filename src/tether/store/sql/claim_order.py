"""The claim of the next runs (reference §13): one conditional UPDATE whose WHERE
picks the runs, by priority (highest first), then, among equal priorities, the run of the
user carrying the fewest runs, then by how long it has waited, so no candidate is read
before it is claimed.

Three kinds of run wait for a worker, each read through its own index in the claim's
order:

- a ready run (running, no owner, not delayed): through its user, the users read in the
  order of their first waiting runs (``user_load_heads``), then the user's own runs
  through ``runs_ready_user``;
- a queued run whose thread is free: ``runs_queued``, in priority then age;
- a queued run whose start time has come: ``runs_starting``, the earliest due first (a
  delayed run's age is its start time), so the runs waiting for later are never read.

Without a cap a claim takes up to ``b_limit`` runs, ranked as ``fair_pick`` says: a batch
spreads across users, the user carrying fewest first, counting the runs it takes itself.

Under ``TETHER_MAX_ACTIVE_PER_USER`` a claim takes one run: of the first users under the
cap in the order of their first waiting runs (``fair_pick.read_heads``, up to the
``b_pick``-th whose first run may be claimed now: no user after it has a better run),
each user's best ready run (``runs_ready_user``), so a claim reads a few rows however
long a user's backlog and however many users wait; among equal priorities the user with
the fewest runs carried goes first. The queued kinds skip the runs of users at their cap.
When the users read cannot tell (many first runs delayed or of versions not served), the
claim takes nothing and is asked again over every user, as ``fair_pick`` says. On
PostgreSQL each kind's pick locks its rows with SKIP LOCKED (the user's ``user_load`` row
with them), so concurrent claimers pick different runs and different users, and the lock
re-checks the count on the row as last committed: two claims for one user are
serialised, and the second sees the first's run carried.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.util import ClauseAdapter

from tether.runs import RunState
from tether.store.backend.dialect import Dialect
from tether.store.sql.claims import _DUE, _READY, CAP, CLAIMED, RUNNING
from tether.store.sql.fair_pick import PICK, exact, fair_pick, read_heads
from tether.store.sql.schema import HAS_WAITING, runs, user_load
from tether.store.sql.served import SERVED
from tether.store.sql.transitions import Transition


def _kind(where: sa.ColumnElement[bool], since: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """One kind of queued run of users under the cap, in its index's order, with what the
    claims compare: the priority, since when it waits, and its user's carried runs."""
    return (
        sa.select(runs.c.id, runs.c.priority, since.label("since"), user_load.c.carried)
        .join_from(runs, user_load, user_load.c.user_id == runs.c.user_id)
        .where(where, SERVED, user_load.c.carried < CAP)
    )


def _heads(dialect: type[Dialect], read: sa.CTE) -> sa.Select[Any]:
    """The best run that may be claimed now of each user ``read`` (the first users under
    the cap in the order of their first waiting runs), fewest carried first among equal
    priorities; locked (with the dialect's ``candidates``) by the user's ``user_load``
    row. With LATERAL (PostgreSQL) each user's best run is one probe of
    ``runs_ready_user``; else it is a correlated subquery joined back by id."""
    best = (
        sa.select(runs.c.id, runs.c.priority, runs.c.updated_at)
        .where(runs.c.user_id == user_load.c.user_id, _READY, SERVED)
        .order_by(runs.c.priority.desc(), runs.c.updated_at)
        .limit(1)
    )
    under = (HAS_WAITING, user_load.c.carried < CAP)
    # Past the first ``b_pick`` users whose heads may be claimed, no user has a better run.
    users = user_load.join(
        read, sa.and_(read.c.user_id == user_load.c.user_id, read.c.before < PICK)
    )
    if dialect.laterals:
        head: Any = best.lateral("head")
        joined = users.join(head, sa.true())
        where: tuple[sa.ColumnElement[bool], ...] = under
    else:
        head = runs.alias("head")
        joined = users.join(
            head,
            head.c.id == best.with_only_columns(runs.c.id).correlate(user_load).scalar_subquery(),
        )
        # The head's own state too, so a lock that waited re-checks it as committed.
        where = (*under, ClauseAdapter(head).traverse(_READY))
    query = (
        sa.select(head.c.id, head.c.priority, head.c.updated_at.label("since"), user_load.c.carried)
        .select_from(joined)
        .where(*where)
        .order_by(head.c.priority.desc(), user_load.c.carried, head.c.updated_at)
        .limit(1)
    )
    return dialect().candidates(query, of=user_load)


def pick_next(dialect: type[Dialect], *, capped: bool) -> sa.Select[Any]:
    """The ids of the best waiting runs, their candidates locked by the dialect's
    ``candidates``: honouring ``b_cap`` when ``capped``, one (a second run of a user could
    take the user past the cap; each claim re-reads the user's count); else at most
    ``b_limit``, the fair pick of ``fair_pick`` (its bounds: ``fair_pick.pick_sizes``)."""
    if not capped:
        return fair_pick(dialect)
    lock = dialect().candidates

    def _first(query: sa.Select[Any], *order: Any) -> sa.Select[Any]:
        return query.order_by(*order).limit(1)

    free = _first(
        _kind(_DUE & runs.c.start_at.is_(None), runs.c.updated_at),
        runs.c.priority.desc(),
        runs.c.updated_at,
    )
    starting = _first(
        _kind(_DUE & runs.c.start_at.is_not(None), runs.c.start_at),
        runs.c.start_at,
    )
    # The first users under the cap in the order of their first waiting runs: when none
    # of their heads may be claimed now (and there are more), it takes nothing, and the
    # claim reads every user instead (``fair_pick``).
    read = read_heads(capped=True)
    kinds = (_heads(dialect, read), lock(free), lock(starting))
    best = sa.union_all(*(sa.select(q.subquery()) for q in kinds)).subquery("waiting")
    return (
        sa.select(best.c.id)
        .where(exact(read, 1))
        .order_by(best.c.priority.desc(), best.c.carried, best.c.since)
        .limit(1)
    )


# The claims built, by dialect class and whether capped: once per backend, not per store.
_BUILT: dict[tuple[type[Dialect], bool], Transition] = {}


def claim_next(dialect: Dialect, *, capped: bool) -> Transition:
    """The claim of the runs ``pick_next`` picks, each re-checked as it is claimed, in the
    store's ``dialect``, built once per backend. A queued run of a thread whose earlier
    run is in the same pick cannot be due (that run is still queued), so a batch never
    starts two runs of one thread."""
    key = (type(dialect), capped)
    if key not in _BUILT:
        _BUILT[key] = _claim(dialect, capped=capped)
    return _BUILT[key]


def _claim(dialect: Dialect, *, capped: bool) -> Transition:
    pick = pick_next(type(dialect), capped=capped)
    chosen = runs.c.id.in_(pick) if capped else dialect.among(runs.c.id, pick)
    conditions = [sa.or_(_READY, _DUE), SERVED]
    # The transaction's id with each run (PostgreSQL), to settle a COMMIT cut off.
    returning = (runs,) if dialect.xid is None else (runs, dialect.xid)
    return Transition(
        [RUNNING, RunState.QUEUED],
        RUNNING,
        chosen,
        *conditions,
        returning=returning,
        **CLAIMED,
    )
