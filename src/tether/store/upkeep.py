"""The reaper's housekeeping: expiring suspensions, re-issuing lost notices, purging runs
past retention (``TETHER_RETENTION_DAYS``, or a user's own, reference §20). Each is a
batch, judged by the database's clock (invariant 11), and served by a partial index so its
cost does not grow with the number of finished runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from tether.reasons import HaltReason
from tether.runs import PendingCall, Run, RunState
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.escalations import MARK_ESCALATION_NOTIFIED
from tether.store.sql.schema import RETAINED, decisions, pending_calls, runs, users
from tether.store.sql.served import SERVED, served
from tether.store.sql.steps import add_event
from tether.store.sql.transitions import Transition, state_in
from tether.store.suspensions import with_calls
from tether.store.threads import delete_threads, kept, still_idle
from tether.store.trees import halted

_SUSPENDED = state_in([RunState.SUSPENDED])

_EXPIRED = (
    sa.select(runs.c.id)
    .where(_SUSPENDED, runs.c.expires_at <= db_now(), SERVED)
    .order_by(runs.c.expires_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
_EXPIRE = Transition(
    RunState.SUSPENDED,
    RunState.HALTED,
    runs.c.id.in_(sa.bindparam("b_ids", expanding=True)),
    runs.c.expires_at <= db_now(),
    returning=(runs.c.id,),
    halt_reason=HaltReason.SUSPENSION_EXPIRED.value,
    updated_at=db_now(),
)

_MARK_CALL_NOTIFIED = (
    pending_calls.update()
    .where(
        pending_calls.c.run_id == sa.bindparam("b_id"),
        pending_calls.c.token_hash == sa.bindparam("b_hash"),
    )
    .values(notified_at=db_now())
)
# A call of the run's suspension whose notice is not delivered and that is not decided.
_UNSENT = (
    sa.select(pending_calls.c.token_hash)
    .where(
        pending_calls.c.run_id == runs.c.id,
        pending_calls.c.epoch == runs.c.lease_epoch,
        pending_calls.c.notified_at.is_(None),
        ~sa.exists().where(decisions.c.token_hash == pending_calls.c.token_hash),
    )
    .exists()
)
# The suspension is notified once every call's notice is delivered (or decided anyway).
_MARK_NOTIFIED = (
    runs.update()
    .where(runs.c.id == sa.bindparam("b_id"), _SUSPENDED, ~_UNSENT)
    .values(notified_at=db_now())
)

_UNNOTIFIED = (
    sa.select(runs)
    .where(
        _SUSPENDED,
        runs.c.notified_at.is_(None),
        runs.c.suspended_at < db_now() - sa.bindparam("b_older", type_=sa.Float),
        runs.c.expires_at > db_now(),
        SERVED,
    )
    .order_by(runs.c.suspended_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
# Not a state change: the run stays suspended on the same calls, one with a new token.
_NEW_TOKEN = (
    pending_calls.update()
    .where(
        pending_calls.c.token_hash == sa.bindparam("b_old"),
        pending_calls.c.notified_at.is_(None),
    )
    .values(token_hash=sa.bindparam("b_new"))
)
_NEW_FIRST_TOKEN = (
    runs.update()
    .where(runs.c.id == sa.bindparam("b_id"), runs.c.pending_token_hash == sa.bindparam("b_old"))
    .values(pending_token_hash=sa.bindparam("b_new"))
)
_REISSUED = (
    runs.update()
    .where(runs.c.id == sa.bindparam("b_id"), _SUSPENDED)
    .values(suspended_at=db_now())
    .returning(runs)
)

# Threads whose every run is halted or finished and unchanged for the retention: a
# thread's runs are purged together, once its most recent run is past retention. The
# candidates come from the retention index (runs past it); a thread with a run that is
# still going, or changed since, is left whole. A child run's thread is never a candidate
# of its own: a tree is purged with its root's thread (reference §18).
_PAST = sa.select(runs.c.thread_id).where(
    state_in(RETAINED),
    runs.c.parent_run_id.is_(None),
    runs.c.updated_at < db_now() - sa.bindparam("b_retention", type_=sa.Float),
    ~kept(runs.c.thread_id),
)
# Users with a retention of their own (reference §20): their runs go by it, and the pass
# by TETHER_RETENTION_DAYS leaves them out, so its cost is that of the retention index
# whatever the number of users without one.
_OWN_RETENTION = users.c.retention_days.is_not(None)
_PAST_RETENTION = (
    _PAST.where(runs.c.user_id.not_in(sa.select(users.c.id).where(_OWN_RETENTION)))
    .order_by(runs.c.updated_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
_PAST_USERS_RETENTION = (
    _PAST.where(runs.c.user_id == sa.bindparam("b_user"))
    .order_by(runs.c.updated_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
_OWN_RETENTIONS = (
    sa.select(users.c.id, users.c.retention_days).where(_OWN_RETENTION).order_by(users.c.id)
)


class Upkeep(StoreBase):
    """Expiry, notices and retention."""

    def expire_suspended(self, batch: int, *, versions: Sequence[str] | None = None) -> list[str]:
        """suspended → halted (``suspension_expired``) for up to ``batch`` runs of
        ``versions`` (None: any) past their window, by the database's clock. Safe to run
        twice and to race an approval: both are conditional on ``state = 'suspended'``, and
        the claim also checks ``expires_at``."""
        with self.begin() as conn:
            due = self.dialect.candidates(_EXPIRED)
            ids = list(conn.execute(due, {"b_batch": batch, **served(versions)}).scalars())
            if not ids:
                return []
            expired = [row.id for row in _EXPIRE.many(conn, {"b_ids": ids})]
            for run_id in expired:
                reason = HaltReason.SUSPENSION_EXPIRED.value
                add_event(conn, run_id, "halted", {"reason": reason})
                halted(conn, run_id, reason, None)  # its parent, if any, hears (§18)
            return expired

    def mark_notified(self, run_id: str, token_hash: str) -> None:
        """Record that the notice of this call of a suspension was delivered (and of the
        suspension, once every call's notice is)."""
        params = {"b_id": run_id, "b_hash": token_hash}
        with self.begin() as conn:
            if conn.execute(_MARK_CALL_NOTIFIED, params).rowcount == 0:
                # Not a call's own token: the second token of its escalation (§19)?
                conn.execute(MARK_ESCALATION_NOTIFIED, params)
                return
            conn.execute(_MARK_NOTIFIED, params)

    def reissue_unnotified(
        self,
        *,
        older_than_s: float,
        batch: int,
        new_hashes: Callable[[], str],
        versions: Sequence[str] | None = None,
    ) -> list[tuple[Run, PendingCall]]:
        """Give each undecided call of a suspension whose notice was never delivered a
        fresh token hash.

        Safe twice: the old token reached nobody (its notice was not delivered), the
        window (``expires_at``) is unchanged, and each swap is conditional on the old hash
        and on the notice still undelivered, so a concurrent reaper or approval cannot be
        overtaken. Only runs of ``versions`` (None: any): the notice is rendered by the
        code the run is written for. Returns (run, the call with its new hash).
        """
        out: list[tuple[Run, PendingCall]] = []
        with self.begin() as conn:
            due = self.dialect.candidates(_UNNOTIFIED)
            params = {"b_older": older_than_s, "b_batch": batch, **served(versions)}
            found = with_calls(conn, [Run.from_row(r._mapping) for r in conn.execute(due, params)])
            for run in found:
                unsent = [c for c in run.pending_calls if c.decided is None and not c.notified]
                swapped = []
                for call in unsent:
                    swap = {"b_id": run.id, "b_old": call.token_hash, "b_new": new_hashes()}
                    if conn.execute(_NEW_TOKEN, swap).rowcount:
                        conn.execute(_NEW_FIRST_TOKEN, swap)
                        swapped.append(dataclasses.replace(call, token_hash=swap["b_new"]))
                row = conn.execute(_REISSUED, {"b_id": run.id}).first()
                if not swapped:
                    conn.execute(_MARK_NOTIFIED, {"b_id": run.id})
                    continue
                if row is not None:
                    add_event(conn, run.id, "notice_reissued", {"calls": len(swapped)})
                    fresh = with_calls(conn, [Run.from_row(row._mapping)])[0]
                    out.extend((fresh, call) for call in swapped)
        return out

    def own_retentions(self) -> list[tuple[str, float]]:
        """Each user with a retention of their own and its seconds (reference §20)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_OWN_RETENTIONS).all()
        return [(str(user), float(days) * 86_400.0) for user, days in rows]

    def purge_retained(self, retention_s: float, batch: int, *, user: str | None = None) -> int:
        """Delete up to ``batch`` threads whose runs were all halted or finished more than
        ``retention_s`` ago, with every run of theirs (messages, events, ledger, decisions,
        idempotency keys, compactions); how many runs went. Of ``user`` (their own
        retention), or of every user without a retention of their own (None). Safe twice:
        a purged thread is gone, so a second pass finds the next ones, or none."""
        with self.begin() as conn:
            params = {"b_retention": retention_s, "b_batch": batch, "b_user": user}
            past = _PAST_RETENTION if user is None else _PAST_USERS_RETENTION
            found = dict.fromkeys(t for t in conn.execute(past, params).scalars() if t)
            # Locked, then judged again: a follow-up added meanwhile keeps its thread.
            return delete_threads(conn, still_idle(conn, self.dialect, list(found), params))
