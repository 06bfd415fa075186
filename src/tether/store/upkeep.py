"""The reaper's housekeeping: expiring suspensions, re-issuing lost notices, purging runs
past retention. Each is a batch, judged by the database's clock (invariant 11), and served
by a partial index so its cost does not grow with the number of finished runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa

from tether.runs import HaltReason, Run, RunState
from tether.store.base import StoreBase
from tether.store.clock import db_now
from tether.store.schema import RETAINED, runs
from tether.store.served import SERVED, served
from tether.store.statements import add_event
from tether.store.threads import delete_threads, kept, still_idle
from tether.store.transitions import Transition, state_in

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

_MARK_NOTIFIED = (
    runs.update()
    .where(runs.c.id == sa.bindparam("b_id"), runs.c.pending_token_hash == sa.bindparam("b_hash"))
    .values(notified_at=db_now())
)

_UNNOTIFIED = (
    sa.select(runs.c.id, runs.c.pending_token_hash)
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
# Not a state change: the run stays suspended on the same call with a new token.
_NEW_TOKEN = (
    runs.update()
    .where(
        runs.c.id == sa.bindparam("b_id"),
        _SUSPENDED,
        runs.c.pending_token_hash == sa.bindparam("b_old"),
    )
    .values(pending_token_hash=sa.bindparam("b_new"), suspended_at=db_now())
    .returning(runs)
)

# Threads whose every run is halted or finished and unchanged for the retention: a
# thread's runs are purged together, once its most recent run is past retention. The
# candidates come from the retention index (runs past it); a thread with a run that is
# still going, or changed since, is left whole.
_PAST_RETENTION = (
    sa.select(runs.c.thread_id)
    .where(
        state_in(RETAINED),
        runs.c.updated_at < db_now() - sa.bindparam("b_retention", type_=sa.Float),
        ~kept(runs.c.thread_id),
    )
    .order_by(runs.c.updated_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
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
            return expired

    def mark_notified(self, run_id: str, token_hash: str) -> None:
        """Record that the notice for this suspension's token was delivered."""
        with self.begin() as conn:
            conn.execute(_MARK_NOTIFIED, {"b_id": run_id, "b_hash": token_hash})

    def reissue_unnotified(
        self,
        *,
        older_than_s: float,
        batch: int,
        new_hashes: Callable[[], str],
        versions: Sequence[str] | None = None,
    ) -> list[tuple[Run, str]]:
        """Give suspended runs whose notice was never delivered a fresh token hash.

        Safe twice: the old token reached nobody (its notice was not delivered), the
        window (``expires_at``) is unchanged, and each swap is conditional on the old hash,
        so a concurrent reaper or approval cannot be overtaken. Only runs of ``versions``
        (None: any): the notice is rendered by the code the run is written for. Returns
        (run, new hash).
        """
        out: list[tuple[Run, str]] = []
        with self.begin() as conn:
            due = self.dialect.candidates(_UNNOTIFIED)
            for run_id, old_hash in conn.execute(
                due, {"b_older": older_than_s, "b_batch": batch, **served(versions)}
            ).all():
                new_hash = new_hashes()
                params = {"b_id": run_id, "b_old": old_hash, "b_new": new_hash}
                row = conn.execute(_NEW_TOKEN, params).first()
                if row is not None:
                    add_event(conn, run_id, "notice_reissued", {})
                    out.append((Run.from_row(row._mapping), new_hash))
        return out

    def purge_retained(self, retention_s: float, batch: int) -> int:
        """Delete up to ``batch`` threads whose runs were all halted or finished more than
        ``retention_s`` ago, with every run of theirs (messages, events, ledger, decisions,
        idempotency keys, compactions); how many runs went. Safe twice: a purged thread is
        gone, so a second pass finds the next ones, or none."""
        with self.begin() as conn:
            params = {"b_retention": retention_s, "b_batch": batch}
            found = dict.fromkeys(t for t in conn.execute(_PAST_RETENTION, params).scalars() if t)
            # Locked, then judged again: a follow-up added meanwhile keeps its thread.
            return delete_threads(conn, still_idle(conn, self.dialect, list(found), params))
