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

_LATER_THAN_NOW = sa.select(sa.bindparam("b_at", type_=sa.Float) > db_now())


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
    """Insert a new run with its first messages and the W3C trace context its spans
    continue (``tether.telemetry.tracing``), in the thread ``thread_id`` (by default a new
    thread of the run's id), inside the caller's transaction, once ``users.admit`` let its
    user and its ``priority`` (under ``priority_bound``) in. A new thread's run is ready at once; a
    ``follow_up`` joins the user's thread (else ``NotFound``): ready if the thread is idle,
    else ``queued`` if ``enqueue``, else ``ThreadBusy``; its messages come when it starts.
    ``request`` is the user's ``Idempotency-Key`` and its body's digest, stored with the
    run (a key naming a run already is an ``IntegrityError`` of ``runs_request_key``). A
    ``start_at`` (epoch seconds) still ahead by the database's clock keeps it ``queued``.
    A child run (reference §18) names its ``parent`` and gets a thread of its own that is
    not a conversation; its user was admitted with its root."""
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
    )
    if start_at is not None and conn.execute(_LATER_THAN_NOW, {"b_at": start_at}).scalar():
        state = RunState.QUEUED
    # A conflict on the key (or the id: a retried creation whose COMMIT landed) is answered.
    keyed = {} if request is None else _keyed(request, state)
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
            scope_resolved_at=db_now(),
            versions=versions,
            agent_version=agent_version,
            message_count=len(messages),
            trace_context=trace_context,
            priority=priority,
            start_at=start_at,
            schedule_id=schedule_id,
            root_run_id=run_id if parent is None else parent.root_run_id,
            parent_run_id=None if parent is None else parent.run_id,
            parent_tool_call_id=None if parent is None else parent.tool_call_id,
            depth=0 if parent is None else parent.depth,
            child_order=0 if parent is None else parent.order,
            started_at=db_now(),
            updated_at=db_now(),
            **keyed,
        )
        .returning(runs)
    ).one()
    run = Run.from_row(row._mapping)
    _first_writes(conn, dialect, run, messages, limits)
    return run


def _first_writes(
    conn: Connection, dialect: Dialect, run: Run, messages: Sequence[Message], limits: Limits
) -> None:
    """What a new run's row is written with: its first messages, its ``created`` event
    (who, the limits, its thread and its order), and a wake-up when it is ready."""
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


def _keyed(request: tuple[str, str], state: RunState) -> dict[str, Any]:
    """The columns of a run created with an ``Idempotency-Key`` (reference §14)."""
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
