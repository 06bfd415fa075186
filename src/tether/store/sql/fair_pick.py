"""The fair pick of a claim without a cap (reference §13): among waiting runs of equal
priority, the run of the user who carries the fewest runs goes first, the oldest first
among those; a batch spreads across users the same way, counting the runs it takes.

A claim of ``b_limit`` runs ranks each candidate by (priority, highest first; its user's
*load*: the runs the user carries plus those of the user's runs the same claim ranks
before it; since when it waits; its id). Taking the first ``b_limit`` of that rank is
what that many claims of one run each would take one after the other.

Which runs are candidates, so that a claim reads a bounded number of rows however long a
user's backlog (bounds: ``pick_sizes``):

- the users, in the order of their first waiting run (``user_load``'s head, kept by its
  triggers: priority, carried runs, since, id; index ``user_load_heads``): the first
  ``b_heads`` are read, each with whether its head can be claimed now (not delayed, of a
  version served: the head is the first of the runs ``ready`` counts, delayed ones
  included). A user whose head can be claimed has, as its best run, that head; any other
  has a best run no better than its head. So once ``b_pick`` users whose heads can be
  claimed are read, no user after them can hold a run of the first ``b_pick``: the pick
  is *exact*. It is exact too when every user with waiting runs was read (fewer than
  ``b_heads``);
- of each user read, its first waiting runs that can be claimed (``runs_ready_user``), no
  more than it has, than ``b_pick`` less the users before it whose heads can be claimed
  (each of those has a run ranked before this user's first), and, when its head has the
  priority of the ``b_pick``-th such head (the *bar*), than the runs it can take before
  its load passes the bar's user's (a run past that ranks after ``b_pick`` others);
- the first ``b_pick`` queued runs of each queued kind, by the kind's index order.

A pick that is not exact takes nothing. A claim that took nothing asks once more, in a
transaction of its own, with ``b_heads`` past every user (``pick_sizes(every=True)``):
that pick is exact, and reads the first runs of every user it needs, as when many users'
first waiting runs are delayed or of versions this worker does not serve.

The first ``b_pick`` of the rank are locked in rank order, skipping rows a concurrent
claimer holds (PostgreSQL: there ``b_pick`` is more than ``b_limit``), and the first
``b_limit`` of them are claimed, so two claimers ranking alike take different runs. A
claim reads ``b_heads`` rows of ``user_load`` and a few runs of each user it may take
from: its cost grows with neither the runs waiting nor the users
(``benchmarks/claims.py``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import visitors

from tether.store.backend.dialect import Dialect
from tether.store.sql.claims import _DUE, _NOT_DELAYED, _READY, CAP
from tether.store.sql.schema import HAS_WAITING, HEADS_ORDER, runs, user_load
from tether.store.sql.served import SERVED

_ORDER = (runs.c.priority.desc(), runs.c.updated_at)


# How many runs the claim takes (``b_limit``), how many of its rank it locks in order
# (``b_pick``), and how many users it reads first (``b_heads``).
LIMIT = sa.bindparam("b_limit", type_=sa.Integer)
PICK = sa.bindparam("b_pick", type_=sa.Integer)
HEADS = sa.bindparam("b_heads", type_=sa.Integer)
# Users read past those ``b_pick`` needs, for heads that cannot be claimed now.
SPARE_HEADS = 8
# ``b_heads`` past every user.
EVERY = 2**31 - 1


def pick_sizes(limit: int, *, spare: bool = True, every: bool = False) -> dict[str, int]:
    """The bounds of a claim of ``limit`` runs: with ``spare`` (where claims run side by
    side: ``Dialect.skips_locked``) it ranks and locks twice as many and two, so that a
    concurrent claimer that ranks alike finds runs past the first's; it reads the first
    ``SPARE_HEADS`` users past those, or with ``every`` every user."""
    pick = 2 * limit + 2 if spare else limit
    return {"b_limit": limit, "b_pick": pick, "b_heads": EVERY if every else pick + SPARE_HEADS}


# Whether a user's head may be claimed now, by what ``user_load`` copies of it: not
# delayed past the database's clock, of a version served.
_HEAD_OF: dict[Any, Any] = {
    runs.c.ready_at: user_load.c.head_ready_at,
    runs.c.agent_version: user_load.c.head_version,
}


def _of_head(element: Any, **kw: Any) -> Any:
    """The column of ``user_load`` that copies ``element`` of the head (None: keep it)."""
    return _HEAD_OF.get(element)


_CLAIMABLE: Any = sa.and_(_NOT_DELAYED, SERVED)
_HEAD_CLAIMABLE: sa.ColumnElement[bool] = visitors.replacement_traverse(_CLAIMABLE, {}, _of_head)


def read_heads(*, capped: bool = False) -> sa.CTE:
    """The first ``b_heads`` users with waiting runs in the order of their heads (under
    ``b_cap`` when ``capped``), each with ``ok``: 1 when its head may be claimed now, and
    ``before``: how many users before it have heads that may."""
    waiting: list[sa.ColumnElement[bool]] = [HAS_WAITING]
    if capped:
        waiting.append(user_load.c.carried < CAP)
    read = (
        sa.select(
            user_load.c.user_id,
            user_load.c.carried,
            user_load.c.ready,
            user_load.c.head_priority,
            user_load.c.head_since,
            user_load.c.head_id,
            sa.case((_HEAD_CLAIMABLE, 1), else_=0).label("ok"),
        )
        .where(*waiting)
        .order_by(*HEADS_ORDER)
        .limit(HEADS)
        .subquery("read")
    )
    order = (read.c.head_priority.desc(), read.c.carried, read.c.head_since, read.c.head_id)
    before = sa.func.sum(read.c.ok).over(order_by=order) - read.c.ok
    return sa.select(read, before.label("before")).cte("heads")


def exact(read: sa.CTE, enough: Any) -> sa.ColumnElement[bool]:
    """Whether a pick from the users ``read`` is the one from every user: it read every
    user with waiting runs, or ``enough`` whose heads may be claimed now."""
    whole = sa.func.count() < HEADS
    return (
        sa.select(sa.or_(whole, sa.func.coalesce(sa.func.sum(read.c.ok), 0) >= enough))
        .select_from(read)
        .scalar_subquery()
    )


def _least(*values: Any) -> sa.ColumnElement[Any]:
    """The least of ``values``, written so both backends take it."""
    least: sa.ColumnElement[Any] = values[0]
    for value in values[1:]:
        least = sa.case((value < least, value), else_=least)
    return least


def _depths(placed: sa.CTE) -> sa.CTE:
    """The users read that may hold a run of the first ``b_pick``, each with how many of its
    runs may (``depth``: see the module's docstring)."""
    # The bar: the ``b_pick``-th user whose head may be claimed, its priority and load.
    at_bar = sa.and_(placed.c.ok == 1, placed.c.before == PICK - 1)
    bar_priority = sa.func.max(sa.case((at_bar, placed.c.head_priority))).over()
    bar_carried = sa.func.max(sa.case((at_bar, placed.c.carried))).over()
    barred = sa.select(
        placed, bar_priority.label("bar_priority"), bar_carried.label("bar_carried")
    ).subquery("barred")
    within = sa.case(
        (
            barred.c.head_priority == barred.c.bar_priority,
            barred.c.bar_carried - barred.c.carried + 1,
        ),
        else_=PICK,
    )
    depth = _least(barred.c.ready, PICK - barred.c.before, within)
    users = sa.select(barred.c.user_id, barred.c.carried, depth.label("depth")).subquery()
    return sa.select(users).where(users.c.depth > 0).cte("users")


def _theirs(dialect: type[Dialect], users: sa.CTE) -> sa.Select[Any]:
    """Each user's first ``depth`` runs that may be claimed now. SQLite takes no column in
    a LIMIT: there each user's first runs are read as deep as the deepest user's."""
    deepest = sa.select(sa.func.max(users.c.depth)).scalar_subquery()
    theirs = (
        sa.select(runs.c.id, runs.c.priority, runs.c.updated_at)
        .where(runs.c.user_id == users.c.user_id, _READY, SERVED)
        .order_by(*_ORDER)
        .limit(users.c.depth if dialect.laterals else deepest)
    )
    if dialect.laterals:
        run: Any = theirs.lateral("theirs")
        joined = users.join(run, sa.true())
    else:
        run = runs.alias("theirs")
        ids = theirs.with_only_columns(runs.c.id).correlate(users)
        joined = users.join(run, run.c.id.in_(ids))
    return sa.select(
        run.c.id, users.c.user_id, run.c.priority, run.c.updated_at.label("since"), users.c.carried
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
    return sa.select(*query.c, user_load.c.carried).join_from(
        query, user_load, user_load.c.user_id == query.c.user_id
    )


def _ranked(candidates: sa.Subquery) -> sa.Subquery:
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
        (candidates.c.carried + before - 1).label("effective"),
    ).subquery("ranked")


def fair_pick(dialect: type[Dialect]) -> sa.Select[Any]:
    """The ids of the runs a claim of ``b_limit`` takes, locked by the dialect's
    ``candidates`` in rank order (see the module's docstring); none when the pick from the
    users read is not exact."""
    read = read_heads()
    free = _queued(_DUE & runs.c.start_at.is_(None), runs.c.updated_at, *_ORDER)
    starting = _queued(_DUE & runs.c.start_at.is_not(None), runs.c.start_at, runs.c.start_at)
    candidates = sa.union_all(_theirs(dialect, _depths(read)), free, starting).subquery()
    ranked = _ranked(candidates)
    rank = (ranked.c.priority.desc(), ranked.c.effective, ranked.c.since, ranked.c.id)
    best = sa.select(ranked).where(exact(read, PICK)).order_by(*rank).limit(PICK).subquery("best")
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
