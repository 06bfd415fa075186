"""The claims' conditions and transitions, built once at import: a ready run's, a
suspension's and an orphan's.

``tether.store.claims`` runs them; each dialect sends the claims of suspensions and
orphans its own way (``Dialect.claim_suspension`` / ``Dialect.claim_orphans``): as the
statement sequences of ``backend/dialect.py``, or, on PostgreSQL, as one statement each
built from these same transitions (``backend/postgres.py``), so the conditions are
written once for both backends.
"""

from __future__ import annotations

import sys
from typing import Any

import sqlalchemy as sa

from tether.reasons import FailReason
from tether.runs import BUSY, RunState
from tether.store.backend.clock import db_now
from tether.store.sql.schema import decisions, pending_calls, runs, user_load
from tether.store.sql.served import SERVED
from tether.store.sql.transitions import Transition, state_in

RUNNING = RunState.RUNNING
ID = runs.c.id == sa.bindparam("b_id")
# What every claim sets: the new owner, a new lease epoch, a fresh heartbeat.
CLAIMED: dict[str, Any] = {
    "owner": sa.bindparam("b_owner"),
    "lease_epoch": runs.c.lease_epoch + 1,
    "heartbeat_at": db_now(),
    "updated_at": db_now(),
    "ready_at": None,
}

# Waiting for a worker: running, no owner (the ready-runs partial index's predicate, so
# the index serves the pick), and not held back by a delay, judged by the DB clock.
_NOT_DELAYED = sa.or_(runs.c.ready_at.is_(None), runs.c.ready_at <= db_now())
_READY = sa.and_(state_in([RUNNING]), runs.c.owner.is_(None), _NOT_DELAYED)

# A queued run (reference §13, §14) starts once no earlier run of its thread is running,
# suspended or queued, and once its start time has come by the database's clock: its
# claim re-checks both in the same conditional UPDATE, so it starts once, in its thread's
# order, however many workers race for it.
_EARLIER = runs.alias("earlier")
_BLOCKED = (
    sa.select(_EARLIER.c.id)
    .where(
        _EARLIER.c.thread_id == runs.c.thread_id,
        _EARLIER.c.thread_pos < runs.c.thread_pos,
        _EARLIER.c.state.in_([sa.literal_column(f"'{s.value}'") for s in BUSY]),
    )
    .exists()
)
_STARTED = sa.or_(runs.c.start_at.is_(None), runs.c.start_at <= db_now())
_DUE = sa.and_(state_in([RunState.QUEUED]), ~_BLOCKED, _STARTED)
# At most ``b_cap`` runs of a user carried at once (reference §13), by ``user_load``.
CAP = sa.bindparam("b_cap", type_=sa.Integer)
_UNDER_CAP = (
    sa.select(user_load.c.user_id)
    .where(user_load.c.user_id == runs.c.user_id, user_load.c.carried < CAP)
    .exists()
)
# The claim of a given run: ready, or queued and due.
CLAIM_GIVEN = Transition(
    [RUNNING, RunState.QUEUED], RUNNING, ID, sa.or_(_READY, _DUE), SERVED, **CLAIMED
)
CLAIM_GIVEN_CAPPED = Transition(
    [RUNNING, RunState.QUEUED], RUNNING, ID, sa.or_(_READY, _DUE), SERVED, _UNDER_CAP, **CLAIMED
)
# A decision on one call of a suspension (reference §15), by its token, while the window
# is open by the database's clock: the suspension is the one its token was issued in (the
# lease epoch it suspended at: every claim moves it on) and the token is not used yet. It
# takes one off ``undecided``; the decision that takes the last one claims the run in the
# same UPDATE (``when``), so of concurrent last decisions exactly one claims: the row's
# lock serialises them, and each sees the count the one before left.
_OF_TOKEN = pending_calls.c.token_hash == sa.bindparam("b_token_hash")
_UNUSED = ~sa.exists().where(decisions.c.token_hash == sa.bindparam("b_token_hash"))
# The lease epoch the token's suspension began at (its call's row, by the primary key).
_EPOCH_OF_TOKEN = (
    sa.select(pending_calls.c.epoch)
    .where(_OF_TOKEN, pending_calls.c.run_id == runs.c.id)
    .scalar_subquery()
)
CALL_OF_TOKEN = sa.select(pending_calls.c.tool_call_id, pending_calls.c.call).where(_OF_TOKEN)
_CLAIMING = {name: value for name, value in CLAIMED.items() if name != "updated_at"}
CLAIM_SUSPENDED = Transition(
    RunState.SUSPENDED,
    RUNNING,
    ID,
    runs.c.lease_epoch == _EPOCH_OF_TOKEN,
    runs.c.undecided > 0,
    _UNUSED,
    runs.c.expires_at > db_now(),
    SERVED,
    when=runs.c.undecided == 1,
    always={"undecided": runs.c.undecided - 1, "updated_at": db_now()},
    **_CLAIMING,
)

# No pass start to stay before: the largest float (finite, so it renders in any plan).
NO_CUTOFF = sys.float_info.max
# An orphan: running under an owner whose heartbeat is older than ``b_stale`` seconds,
# and older than ``b_before`` (the start of the reaper's pass: a run it claimed has a
# fresh heartbeat, so one pass never takes a run twice). The claim re-checks both, so a
# run whose owner came back (or that another reaper took) meanwhile is left alone.
STALE = sa.and_(
    runs.c.owner.is_not(None),
    runs.c.heartbeat_at < db_now() - sa.bindparam("b_stale", type_=sa.Float),
    runs.c.heartbeat_at < sa.bindparam("b_before", value=NO_CUTOFF, type_=sa.Float),
    SERVED,
)
ORPHANS = (
    sa.select(runs.c.id)
    .where(state_in([RUNNING]), STALE)
    .order_by(runs.c.heartbeat_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
# Within its recovery attempts (``b_max``) an orphan is recovered, past them it fails.
WITHIN = runs.c.recovery_attempts < sa.bindparam("b_max")
PAST = runs.c.recovery_attempts >= sa.bindparam("b_max")
RECOVERED: dict[str, Any] = {**CLAIMED, "recovery_attempts": runs.c.recovery_attempts + 1}
EXHAUSTED: dict[str, Any] = {
    "returning": (runs.c.id, runs.c.recovery_attempts),
    "fail_reason": FailReason.RECOVERY_EXHAUSTED.value,
    "owner": None,
    "updated_at": db_now(),
}
RECOVER = Transition(RUNNING, RUNNING, ID, STALE, WITHIN, **RECOVERED)
EXHAUST = Transition(RUNNING, RunState.FAILED, ID, STALE, PAST, **EXHAUSTED)
