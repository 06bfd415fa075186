"""Creating runs (``insert_run``: a run's row, its first messages and its ``created``
event, in the caller's transaction), and idempotent creation beside it (reference §14).

A run created under its user's ``Idempotency-Key`` stores the key, the digest of the
request's body and the state it first answered in its own row (``runs.request_key``,
unique per user by a partial index), inserted in the transaction that creates the run, so
the key and its run exist together or not at all, and the key is free again once its run
is deleted or purged.

Concurrent requests with one key never make two runs, and a fresh key costs no statement
of its own (the run's INSERT, built and cached as without a key, carries it). On SQLite
writers are serialised (``BEGIN IMMEDIATE``); on PostgreSQL a second transaction's INSERT
of the same key waits on the unique index until the first commits. Either way the second
INSERT fails on the index, and the request rolls back and answers the first request's
answer, read then. A follow-up of the same key waits on its thread's lock instead and
finds the thread busy with the first's run: its ``thread_busy`` is answered by the
first's key too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from tether.budget import Limits
from tether.errors import ThreadBusy
from tether.models.base import Message
from tether.runs import Run, RunState, iso
from tether.store.backend import faults
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect
from tether.store.base import StoreBase
from tether.store.records import ChildOf, RunRequest
from tether.store.sql.claims import RUNNING
from tether.store.sql.schema import runs
from tether.store.sql.steps import INSERT_MESSAGE, add_event
from tether.store.threads import place_run
from tether.store.users import admit

# A new run's times: its scope is resolved, and it starts, now by the database's clock.
_TIMES = {"scope_resolved_at": db_now(), "started_at": db_now(), "updated_at": db_now()}


def insert_run(
    conn: Connection,
    dialect: Dialect,
    *,
    run_id: str,
    user_id: str,
    question: str,
    route: dict[str, Any],
    limits: Limits,
    scope: dict[str, Any],
    versions: dict[str, Any],
    agent_version: str,
    messages: Sequence[Message],
    trace_context: dict[str, str] | None = None,
    thread_id: str | None = None,
    follow_up: bool = False,
    enqueue: bool = False,
    request: tuple[str, str] | None = None,
    priority: int | None = None,
    priority_bound: int | None = None,
    start_at: float | None = None,
    schedule_id: str | None = None,
    parent: ChildOf | None = None,
) -> Run:
    """Insert a new run, its first messages and the W3C trace context its spans continue,
    in the caller's transaction, once ``users.admit`` let its user and ``priority`` (under
    ``priority_bound``) in. A new thread's run is ready at once; a ``follow_up`` joins the
    user's thread ``thread_id`` as ``place_run`` says (its messages come when it starts).
    ``request``: the user's ``Idempotency-Key`` and its body's digest (a key naming a run
    already is an ``IntegrityError`` of ``runs_request_key``). A child run (reference §18)
    names its ``parent`` (its user was admitted with its root)."""
    if parent is None:
        priority = admit(conn, dialect, user_id, priority=priority, bound=priority_bound)
    thread_id = thread_id or run_id
    state, place = place_run(
        conn,
        dialect,
        thread_id=thread_id,
        user_id=user_id,
        follow_up=follow_up,
        enqueue=enqueue,
        conversation=parent is None,
        start_at=start_at,
    )
    row = conn.execute(
        runs.insert()
        .values(
            id=run_id,
            user_id=user_id,
            question=question,
            route=route,
            state=state.value,
            thread_id=thread_id,
            thread_pos=place,
            **limits.to_json(),
            scope_snapshot=scope,
            versions=versions,
            agent_version=agent_version,
            message_count=len(messages),
            trace_context=trace_context,
            priority=priority,
            start_at=start_at,
            schedule_id=schedule_id,
            **({"root_run_id": run_id} if parent is None else parent.columns()),
            **_TIMES,
            **({} if request is None else _keyed(request, state)),
        )
        .returning(runs)
    ).one()
    return _first_writes(conn, dialect, Run.from_row(row._mapping), messages, limits)


def _first_writes(
    conn: Connection, dialect: Dialect, run: Run, messages: Sequence[Message], limits: Limits
) -> Run:
    """What a new run's row is written with: its first messages, its ``created`` event
    (who, the limits, its thread and its order), and a wake-up when it is ready; the run."""
    if messages:
        conn.execute(
            INSERT_MESSAGE,
            [{"run_id": run.id, "seq": i, "message": m} for i, m in enumerate(messages)],
        )
    created: dict[str, Any] = {"user_id": run.user_id, "limits": limits.to_json()}
    created.update(thread_id=run.thread_id, priority=run.priority)
    if run.state is RunState.QUEUED:
        created["queued"] = True
    if run.start_at is not None:
        created["start_at"] = iso(run.start_at)
    if run.schedule_id is not None:
        created["schedule_id"] = run.schedule_id
    add_event(conn, run.id, "created", created)
    if run.state is RUNNING:
        dialect.wake(conn)
    return run


def _keyed(request: tuple[str, str], state: RunState) -> dict[str, Any]:
    """The columns of a run created with an ``Idempotency-Key`` (reference §14): a conflict
    on the key (or the id: a retried creation whose COMMIT landed) is answered."""
    return {"request_key": request[0], "request_digest": request[1], "request_state": state.value}


# The status a creation answers (reference §6: 202 Accepted).
ACCEPTED = 202

_REQUEST = sa.select(runs).where(
    runs.c.user_id == sa.bindparam("b_user"), runs.c.request_key == sa.bindparam("b_key")
)


class Creation(StoreBase):
    """Creating runs: plainly, or under an ``Idempotency-Key`` (looking one up, creating a
    run under one)."""

    def create_run(self, **fields: Any) -> Run:
        """Insert a new run (``insert_run`` of ``fields``) in a transaction of its own.
        With an ``Idempotency-Key`` a creation is ``create_requested_run``."""
        with self.begin() as conn:
            return insert_run(conn, self.dialect, **fields)

    def run_request(self, user_id: str, key: str) -> RunRequest | None:
        """``user_id``'s request stored under ``key``, with its run as it is now; None
        when the key is free (never used, or its run was deleted or purged)."""
        with self.engine.connect() as conn:
            row = conn.execute(_REQUEST, {"b_user": user_id, "b_key": key}).first()
        if row is None:
            return None
        run = Run.from_row(row._mapping)
        return RunRequest(
            key=key,
            digest=row.request_digest,
            status=ACCEPTED,
            response={"id": run.id, "state": row.request_state},
            run=run,
        )

    @faults.idempotent
    def create_requested_run(self, *, key: str, digest: str, **fields: Any) -> RunRequest:
        """A new run (``insert_run`` of ``fields``) stored with ``user_id``'s
        ``key`` and ``digest``, in one transaction; or, when the key names a run already,
        that request (whatever its body: the caller compares ``digest``). A refusal
        (``thread_busy``, ``not_found``) stores nothing.

        Safe to try again, even after its COMMIT was cut off: a second try finds the key
        the first stored, if it landed, and answers with it."""
        try:
            with self.begin() as conn:
                run = insert_run(conn, self.dialect, request=(key, digest), **fields)
        except (ThreadBusy, IntegrityError):
            # Rolled back. Another request of this key (or this one's first try) stored
            # it first; or the refusal is this request's own.
            found = self.run_request(fields["user_id"], key)
            if found is None:
                raise
            return found
        response = {"id": run.id, "state": run.state.value}
        return RunRequest(key=key, digest=digest, status=ACCEPTED, response=response, run=run)
