"""Erasing a user's data (reference §20, ``tether users erase``, ``DELETE
/v1/users/me/data``), in transactions of bounded size, each safe to run again:

1. ``begin_erasure``: the user's row marked removed (made so if there was none, so no run
   of that name starts while its data goes), then everything ``tether users remove`` does
   (``users.withdraw``): keys revoked, sessions ended, schedules deleted, runs in flight
   cancelled, so a worker carrying one is fenced at its next write;
2. ``erase_runs``, batch after batch: every run of the user, each deleted whole with every
   row of it (``threads.delete_runs``, as retention purges), so a crash leaves the user
   partly erased, never half a run;
3. ``erase_threads``, batch after batch: the user's threads, once their runs are gone;
4. ``finish_erasure``: the user's rows of the flow control, the user's row itself (the
   name is free again), their name in other users' decisions, approvals and events made
   its digest, the audit rewritten as the schema's trigger allows (migration 0017), and
   one ``erased`` record.

The engine's operator runs them in order (``Operator.erase_user``); erasing again after a
crash finds what is left and finishes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.store import audit as audit_log
from tether.store.audit import AuditKind
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import (
    api_keys,
    approvals,
    audit,
    decisions,
    model_usage,
    model_waits,
    pending_calls,
    run_events,
    runs,
    threads,
    user_load,
    users,
    web_sessions,
)
from tether.store.threads import delete_runs
from tether.store.users import Removal, withdraw

# The digest an erased name becomes, as migration 0017's audit trigger expects it.
DIGEST = "sha256:"

_NAME = sa.bindparam("b_user", type_=sa.String)
_DIGESTED = sa.bindparam("b_digest", type_=sa.String)
_BATCH = sa.bindparam("b_batch", type_=sa.Integer)

_LIVE = users.c.removed_at.is_(None)
_MARK_REMOVED = users.update().where(users.c.id == _NAME, _LIVE).values(removed_at=db_now())
# Through the ``runs_user`` index: the cost of a batch does not grow with other users' runs.
_RUNS_OF_USER = (
    sa.select(runs.c.id).where(runs.c.user_id == _NAME).order_by(runs.c.started_at).limit(_BATCH)
)
_THREADS_OF_USER = sa.select(threads.c.id).where(threads.c.user_id == _NAME).limit(_BATCH)

# The runs of others the user acted on (decided, approved, cancelled, moved): their
# events may name the user as ``by``.
_ACTED_ON = sa.union(
    sa.select(decisions.c.run_id).where(decisions.c.decided_by == _NAME),
    sa.select(pending_calls.c.run_id)
    .join(approvals, approvals.c.token_hash == pending_calls.c.token_hash)
    .where(approvals.c.approver == _NAME),
    sa.select(audit.c.run_id).where(audit.c.by == _NAME, audit.c.run_id.is_not(None)),
)
_EVENTS_OF = sa.select(run_events.c.id, run_events.c.data).where(
    run_events.c.run_id.in_(sa.bindparam("b_runs", expanding=True))
)
_RENAME_IN_EVENT = (
    run_events.update()
    .where(run_events.c.id == sa.bindparam("b_id"))
    .values(data=sa.bindparam("b_data", type_=run_events.c.data.type))
)
_RENAME_DECIDER = (
    decisions.update().where(decisions.c.decided_by == _NAME).values(decided_by=_DIGESTED)
)
_RENAME_APPROVER = (
    approvals.update().where(approvals.c.approver == _NAME).values(approver=_DIGESTED)
)

# The audit: the user's own records keep seq, at, kind and outcome, their name becomes its
# digest and every other field goes (``by`` naming someone else stays: the trigger lets a
# name become a digest, never null); in other records, ``by`` naming the user becomes it.
_ERASABLE = ("run_id", "root_run_id", "tool", "tool_call_id", "digest", "decision", "reason")
_OWN_RECORDS = (
    audit.update()
    .where(audit.c.user_id == _NAME)
    .values(
        user_id=_DIGESTED,
        by=sa.case((audit.c.by == _NAME, _DIGESTED), else_=audit.c.by),
        **dict.fromkeys(_ERASABLE),
    )
)
_RECORDS_BY = audit.update().where(audit.c.by == _NAME).values(by=_DIGESTED)
_DELETE_USER_ROWS = [
    table.delete().where(table.c.user_id == _NAME)
    for table in (user_load, model_usage, model_waits, web_sessions, api_keys)
]
_DELETE_USER = users.delete().where(users.c.id == _NAME)
_CHUNK = 500


def digest_of(user_id: str) -> str:
    """The one-way digest an erased name is replaced by."""
    return DIGEST + hashlib.sha256(user_id.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Erased:
    """What one erasure deleted: runs (children of trees included), threads (the user's
    conversations) and schedules; zeros when nothing was left of the user."""

    runs: int = 0
    threads: int = 0
    schedules: int = 0

    def to_json(self) -> dict[str, int]:
        return {"runs": self.runs, "threads": self.threads, "schedules": self.schedules}


class Erasure(StoreBase):
    """The transactions of an erasure, in the order the operator runs them."""

    def begin_erasure(self, user_id: str) -> Removal:
        """Mark ``user_id`` removed (a row made removed if there was none), then withdraw
        them as ``remove_user`` does, in one transaction. Safe twice: the row stays
        removed, and nothing is left to revoke, delete or cancel."""
        params = {"b_user": user_id}
        created = self.dialect.insert_new(users).values(
            id=user_id, created_at=db_now(), removed_at=db_now()
        )
        with self.begin() as conn:
            conn.execute(created)
            # The user's row first, as in ``remove_user``: it waits for the writers of
            # their runs in flight (``users.admit``), and every writer after it is refused.
            conn.execute(_MARK_REMOVED, params)
            return withdraw(conn, self.dialect, user_id)

    def erase_runs(self, user_id: str, batch: int) -> int:
        """Delete up to ``batch`` runs of ``user_id``, each whole; how many went. Safe
        twice and under a concurrent erasure: a deleted run is not found (or counted)
        again."""
        with self.begin() as conn:
            params = {"b_user": user_id, "b_batch": batch}
            return delete_runs(conn, list(conn.execute(_RUNS_OF_USER, params).scalars()))

    def erase_threads(self, user_id: str, batch: int) -> tuple[int, int]:
        """Delete up to ``batch`` threads of ``user_id`` (their runs are gone already);
        how many rows went and how many of them were conversations (§14; a child run's
        thread is none). Safe twice: a deleted thread is not found again."""
        with self.begin() as conn:
            params = {"b_user": user_id, "b_batch": batch}
            ids = list(conn.execute(_THREADS_OF_USER, params).scalars())
            if not ids:
                return 0, 0
            gone = threads.delete().where(threads.c.id.in_(ids)).returning(threads.c.conversation)
            found = list(conn.execute(gone).scalars())
            return len(found), sum(1 for conversation in found if conversation)

    def finish_erasure(self, user_id: str, *, by: str | None) -> None:
        """The erasure's last transaction: the user's rows of the flow control, keys and
        sessions, and the user's row (the name is free again); their name, where other
        users' runs and the audit keep it, made its digest; then one ``erased`` record
        (``by``: who asked, the user's digest if they asked themselves). Safe twice: the
        second finds no row and no name left, and records the request again."""
        digest = digest_of(user_id)
        params = {"b_user": user_id, "b_digest": digest}
        with self.begin() as conn:
            _rename_in_events(conn, user_id, digest)
            conn.execute(_RENAME_DECIDER, params)
            conn.execute(_RENAME_APPROVER, params)
            for statement in _DELETE_USER_ROWS:
                conn.execute(statement, params)
            conn.execute(_DELETE_USER, params)
            conn.execute(_OWN_RECORDS, params)
            conn.execute(_RECORDS_BY, params)
            asker = digest if by == user_id else by
            record = {"user_id": digest, "by": asker, "outcome": "erased"}
            audit_log.append(conn, AuditKind.ERASED, [record])


def _rename_in_events(conn: Connection, user_id: str, digest: str) -> None:
    """In the events of other users' runs the user acted on, ``by`` naming the user
    becomes its digest (before the decisions and the audit that lead to them change)."""
    acted_on = [r for r in conn.execute(_ACTED_ON, {"b_user": user_id}).scalars() if r]
    for start in range(0, len(acted_on), _CHUNK):
        chunk = acted_on[start : start + _CHUNK]
        renamed: list[dict[str, Any]] = [
            {"b_id": row.id, "b_data": {**row.data, "by": digest}}
            for row in conn.execute(_EVENTS_OF, {"b_runs": chunk})
            if isinstance(row.data, dict) and row.data.get("by") == user_id
        ]
        if renamed:
            conn.execute(_RENAME_IN_EVENT, renamed)
