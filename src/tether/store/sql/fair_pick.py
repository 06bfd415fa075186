"""The fair pick of a claim without a cap (reference §13): among waiting runs of equal
priority, the run of the user who carries the fewest runs goes first, the oldest first
among those; a batch spreads across users the same way, counting the runs it takes.

A claim of ``b_limit`` runs ranks each candidate by (priority, highest first; its user's
*load*: the runs the user carries plus those of the user's runs the same claim ranks
before it; since when it waits). Taking the first ``b_limit`` of that rank is what that
many claims of one run each would take one after the other.

Which runs are candidates, so that a claim reads a bounded number of rows however long
a user's backlog (bounds: ``pick_sizes``):

- the cheap look (``_look``): the first ``b_scan`` ready runs by priority then age,
  ranked among themselves. Its first ``b_pick`` are the best there are when the look
  holds every ready run, or when none of them has a higher load than the least a run
  outside the look can have (``_outside``, from ``user_load``): a run outside comes later
  in priority then age, so it ranks after any run of the look whose load is no higher;
- otherwise every user's best ready run (``user_load`` names the users with ready runs;
  one probe of ``runs_ready_user`` each) ranks the users, and only the first ``b_pick``
  users can hold a run of the first ``b_pick`` (a user ranked after them is passed by
  each of them, and each of them is then ranked at least once before it); of each, no
  more runs than it has ready and than ``b_pick`` less the users before it are read;
- the first ``b_pick`` queued runs of each queued kind, by the kind's index order.

The first ``b_pick`` of the rank are locked in rank order, skipping rows a concurrent
claimer holds (PostgreSQL: there ``b_pick`` is more than ``b_limit``), and the first
``b_limit`` of them are claimed, so two claimers ranking alike take different runs. The
cost grows with the users who have ready runs, never with the runs waiting
(``benchmarks/claims.py``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tether.store.backend.dialect import Dialect
from tether.store.sql.claims import _DUE, _READY
from tether.store.sql.schema import runs, user_load
from tether.store.sql.served import SERVED

_ORDER = (runs.c.priority.desc(), runs.c.updated_at)


# How many runs the claim takes (``b_limit``), how many of its rank it locks in order
# (``b_pick``), and how many ready runs the cheap look reads (``b_scan``).
LIMIT = sa.bindparam("b_limit", type_=sa.Integer)
PICK = sa.bindparam("b_pick", type_=sa.Integer)
SCAN = sa.bindparam("b_scan", type_=sa.Integer)


def pick_sizes(limit: int, *, spare: bool = True) -> dict[str, int]:
    """The bounds of a claim of ``limit`` runs: with ``spare`` (where claims run side by
    side: ``Dialect.skips_locked``) it ranks and locks twice as many and two, so that a
    concurrent claimer that ranks alike finds runs past the first's; its cheap look reads
    64 ready runs past those."""
    pick = 2 * limit + 2 if spare else limit
    return {"b_limit": limit, "b_pick": pick, "b_scan": pick + 64}


def _loaded(query: sa.Select[Any], user: Any) -> sa.Select[Any]:
    """``query`` with the carried runs of the user of its column ``user``."""
    return query.add_columns(user_load.c.carried).join(user_load, user_load.c.user_id == user)


def _ranked(candidates: sa.Subquery | sa.CTE) -> sa.Select[Any]:
    """The candidates with each one's ``effective`` load: its user's carried runs plus its
    user's candidates ranked before it (by priority, then since when they wait)."""
    before = sa.func.row_number().over(
        partition_by=candidates.c.user_id,
        order_by=(candidates.c.priority.desc(), candidates.c.since, candidates.c.id),
    )
    return sa.select(
        candidates.c.id,
        candidates.c.user_id,
        candidates.c.priority,
        candidates.c.since,
        candidates.c.carried,
        (candidates.c.carried + before - 1).label("effective"),
    )


def _first(ranked: sa.Subquery, count: Any) -> sa.Select[Any]:
    """The first ``count`` of ``ranked`` in the claim's order."""
    return (
        sa.select(ranked)
        .order_by(ranked.c.priority.desc(), ranked.c.effective, ranked.c.since, ranked.c.id)
        .limit(count)
    )


# Above every load: the bound of the runs outside the look when there are none.
_NO_LOAD = 2**31 - 1


def _look() -> tuple[sa.Select[Any], sa.ColumnElement[bool]]:
    """The cheap look's candidates (its first ``b_pick``) and whether they are exact: the
    look holds every ready run, or none of its first ``b_pick`` has a higher load than the
    least any run outside it can have (``_outside``)."""
    scanned = (
        sa.select(runs.c.id, runs.c.user_id, runs.c.priority, runs.c.updated_at.label("since"))
        .where(_READY, SERVED)
        .order_by(*_ORDER)
        .limit(SCAN)
        .subquery("scanned")
    )
    look = _loaded(sa.select(*scanned.c), scanned.c.user_id).cte("look")
    best = _first(_ranked(look).subquery("look_ranked"), PICK).cte("look_best")
    whole = sa.select(sa.func.count()).select_from(look).scalar_subquery() < SCAN
    highest = sa.select(sa.func.coalesce(sa.func.max(best.c.effective), 0)).scalar_subquery()
    chosen = sa.select(best.c.id, best.c.user_id, best.c.priority, best.c.since, best.c.carried)
    exact = sa.select(sa.or_(whole, highest <= _outside(look)).label("exact")).cte("exact")
    return chosen, sa.select(exact.c.exact).scalar_subquery()


def _outside(look: sa.CTE) -> sa.ColumnElement[Any]:
    """The least load a ready run outside the look can have: a user with none in it has
    its carried runs; a user with ``n`` in it and more ready (by ``user_load``, which
    counts delayed runs too, so this errs low), its carried runs and ``n``. A run outside
    comes after every run of the look in priority then age, so it ranks after any run of
    the look whose load is no higher."""
    theirs = (
        sa.select(look.c.user_id, sa.func.count().label("n"))
        .group_by(look.c.user_id)
        .subquery("theirs")
    )
    absent = sa.select(user_load.c.carried.label("load")).where(
        user_load.c.ready > 0, user_load.c.user_id.not_in(sa.select(theirs.c.user_id))
    )
    more = (
        sa.select((user_load.c.carried + theirs.c.n).label("load"))
        .join_from(theirs, user_load, user_load.c.user_id == theirs.c.user_id)
        .where(user_load.c.ready > theirs.c.n)
    )
    loads = sa.union_all(absent, more).subquery("loads")
    return sa.select(sa.func.coalesce(sa.func.min(loads.c.load), _NO_LOAD)).scalar_subquery()


def _heads(dialect: type[Dialect]) -> sa.Subquery:
    """The first ``b_pick`` users with ready runs, ranked by their best ready run as the
    claim ranks runs (priority, carried runs, since), each with how many of its runs can
    be among the first ``b_pick`` (``depth``): no more than it has ready, and no more than
    ``b_pick`` less the users ranked before it (each of those has a run ranked before
    this user's first)."""
    best = (
        sa.select(runs.c.id, runs.c.priority, runs.c.updated_at)
        .where(runs.c.user_id == user_load.c.user_id, _READY, SERVED)
        .order_by(*_ORDER)
        .limit(1)
    )
    if dialect.laterals:
        head: Any = best.lateral("head")
        joined = user_load.join(head, sa.true())
    else:
        head = runs.alias("head")
        first = best.with_only_columns(runs.c.id).correlate(user_load).scalar_subquery()
        joined = user_load.join(head, head.c.id == first)
    order = (head.c.priority.desc(), user_load.c.carried, head.c.updated_at, head.c.id)
    before = sa.func.row_number().over(order_by=order) - 1
    room = PICK - before
    depth = sa.case((user_load.c.ready < room, user_load.c.ready), else_=room)
    return (
        sa.select(user_load.c.user_id, user_load.c.carried, depth.label("depth"))
        .select_from(joined)
        .where(user_load.c.ready > 0)
        .order_by(*order)
        .limit(PICK)
        .subquery("heads")
    )


def _every_user(dialect: type[Dialect]) -> sa.Select[Any]:
    """The ready runs of the first ``b_pick`` users that can be among the first
    ``b_pick`` (each user's first ``depth``)."""
    heads = _heads(dialect)
    # SQLite takes no column in a LIMIT: there each user's first ``b_pick`` are read.
    depth = heads.c.depth if dialect.laterals else PICK
    theirs = (
        sa.select(runs.c.id, runs.c.priority, runs.c.updated_at)
        .where(runs.c.user_id == heads.c.user_id, _READY, SERVED)
        .order_by(*_ORDER)
        .limit(depth)
    )
    if dialect.laterals:
        run: Any = theirs.lateral("theirs")
        joined = heads.join(run, sa.true())
    else:
        run = runs.alias("theirs")
        ids = theirs.with_only_columns(runs.c.id).correlate(heads)
        joined = heads.join(run, run.c.id.in_(ids))
    return sa.select(
        run.c.id, heads.c.user_id, run.c.priority, run.c.updated_at.label("since"), heads.c.carried
    ).select_from(joined)


def _queued(where: sa.ColumnElement[bool], since: Any, *order: Any) -> sa.Select[Any]:
    """The first ``b_pick`` queued runs of one kind, in its index's order."""
    query = (
        sa.select(runs.c.id, runs.c.user_id, runs.c.priority, since.label("since"))
        .where(where, SERVED)
        .order_by(*order)
        .limit(PICK)
        .subquery()
    )
    return _loaded(sa.select(*query.c), query.c.user_id)


def fair_pick(dialect: type[Dialect]) -> sa.Select[Any]:
    """The ids of the runs a claim of ``b_limit`` takes, locked by the dialect's
    ``candidates`` in rank order (see the module's docstring)."""
    look, exact = _look()
    every = _every_user(dialect)
    free = _queued(_DUE & runs.c.start_at.is_(None), runs.c.updated_at, *_ORDER)
    starting = _queued(_DUE & runs.c.start_at.is_not(None), runs.c.start_at, runs.c.start_at)
    candidates = sa.union_all(
        look.where(exact),
        every.where(~exact),
        free,
        starting,
    ).subquery("candidates")
    best = _first(_ranked(candidates).subquery("ranked"), PICK).subquery("best")
    locked = (
        sa.select(runs.c.id, runs.c.user_id)
        .join(best, best.c.id == runs.c.id)
        .order_by(best.c.priority.desc(), best.c.effective, best.c.since, best.c.id)
        .limit(LIMIT)
    )
    # A CTE is computed once: as a subquery of the UPDATE's IN, PostgreSQL may rescan the
    # pick for each row it updates, and each rescan would skip the rows just claimed.
    picked = dialect().candidates(locked, of=runs).cte("picked")
    # The claim's triggers count each run in its user's ``user_load`` row: those rows are
    # locked first, in one order, so two claims of runs of the same users never deadlock.
    users = (
        sa.select(user_load.c.user_id)
        .where(user_load.c.user_id.in_(sa.select(picked.c.user_id)))
        .order_by(user_load.c.user_id)
    )
    held = sa.select(sa.func.count()).select_from(dialect().lock(users).subquery())
    return sa.select(picked.c.id).where(held.scalar_subquery() >= 0)
