"""Threads (reference §14): placing a run in its conversation, reading a thread's
conversation by reference, listing and deleting threads.

A follow-up stores only its own messages; the conversation the model sees is read from
the thread's runs in place (``runs.thread_pos``, then each message's ``seq``), in one
statement, so the bytes a thread stores grow with its messages, not with runs times history.
Whoever adds a run to a thread locks the thread's row first, so two follow-ups never both
find it idle, and places are given in the order the locks were granted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.errors import InvalidInput, NotFound, ThreadBusy
from tether.models.base import Message
from tether.runs import BUSY, Run, RunState
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect
from tether.store.base import StoreBase
from tether.store.sql.schema import (
    RETAINED,
    approvals,
    compactions,
    decisions,
    pending_calls,
    run_events,
    run_messages,
    runs,
    threads,
    tool_calls,
)
from tether.store.sql.transitions import state_in

_THREAD = threads.c.id == sa.bindparam("b_thread")
_OF_USER = threads.c.user_id == sa.bindparam("b_user")
_ANY_OF_USER = sa.select(threads).where(_THREAD, _OF_USER)
# A conversation (reference §14); a child run's thread (reference §18) is none.
_THREAD_ROW = _ANY_OF_USER.where(threads.c.conversation)
_ANY_THREAD_ROW = sa.select(threads).where(_THREAD, threads.c.conversation)
_NEW_THREAD = threads.insert().values(
    id=sa.bindparam("b_thread"),
    user_id=sa.bindparam("b_user"),
    conversation=sa.bindparam("b_conversation", type_=sa.Boolean),
    runs=1,
    created_at=db_now(),
    updated_at=db_now(),
)
_LATER_THAN_NOW = sa.select(sa.bindparam("b_at", type_=sa.Float) > db_now())
_NEXT_PLACE = (
    threads.update()
    .where(_THREAD)
    .values(runs=threads.c.runs + 1, updated_at=db_now())
    .returning(threads.c.runs)
)
# The run a busy thread waits on: the earliest running or suspended one, else the
# earliest queued one (reference §14), read through the thread's busy-runs index.
_WAITED_ON = (
    sa.select(runs.c.id)
    .where(runs.c.thread_id == sa.bindparam("b_thread"), state_in(BUSY))
    .order_by(sa.case((state_in([RunState.QUEUED]), 1), else_=0), runs.c.thread_pos)
    .limit(1)
)
# Every message of the thread's runs before place ``b_pos``, in conversation order.
_HISTORY = (
    sa.select(run_messages.c.message)
    .select_from(run_messages.join(runs, runs.c.id == run_messages.c.run_id))
    .where(runs.c.thread_id == sa.bindparam("b_thread"), runs.c.thread_pos < sa.bindparam("b_pos"))
    .order_by(runs.c.thread_pos, run_messages.c.seq)
)
_CONVERSATION = (
    sa.select(run_messages.c.message)
    .select_from(run_messages.join(runs, runs.c.id == run_messages.c.run_id))
    .where(runs.c.thread_id == sa.bindparam("b_thread"))
    .order_by(runs.c.thread_pos, run_messages.c.seq)
)
_RUNS_OF = (
    sa.select(runs)
    .where(runs.c.thread_id.in_(sa.bindparam("b_threads", expanding=True)))
    .order_by(runs.c.thread_id, runs.c.thread_pos)
)
_LAST = sa.func.max(runs.c.updated_at).label("last")
_EVERY_THREAD = (
    sa.select(threads.c.id, threads.c.user_id, threads.c.created_at, _LAST)
    .select_from(threads.join(runs, runs.c.thread_id == threads.c.id))
    .where(threads.c.conversation)
    .group_by(threads.c.id, threads.c.user_id, threads.c.created_at)
    .order_by(_LAST.desc(), threads.c.id)
    .limit(sa.bindparam("b_limit", type_=sa.Integer))
)
_THREADS_OF_USER = _EVERY_THREAD.where(_OF_USER)
_THREAD_OF_RUN = sa.select(runs.c.thread_id, runs.c.thread_pos).where(
    runs.c.id == sa.bindparam("b_id")
)
_LOCK_THREAD = sa.select(threads.c.id).where(_THREAD)
# A later run of the thread that is part of its conversation (it has messages) or will
# be (it is busy): a halted run before it cannot go on without rewriting what it saw.
_LATER = (
    sa.select(runs.c.id)
    .where(
        runs.c.thread_id == sa.bindparam("b_thread"),
        runs.c.thread_pos > sa.bindparam("b_pos"),
        sa.or_(state_in(BUSY), runs.c.message_count > 0),
    )
    .order_by(runs.c.thread_pos)
    .limit(1)
)
_IDS_OF_THREADS = sa.select(runs.c.id).where(
    runs.c.thread_id.in_(sa.bindparam("b_threads", expanding=True))
)
# The child runs of the trees whose roots are ``b_roots`` (reference §18).
_TREES_BELOW = sa.select(runs.c.id, runs.c.thread_id).where(
    runs.c.root_run_id.in_(sa.bindparam("b_roots", expanding=True)),
    runs.c.parent_run_id.is_not(None),
)


@dataclass(frozen=True, kw_only=True)
class ThreadRecord:
    """A thread as stored: its runs in order and, when asked for, its conversation."""

    id: str
    user_id: str
    created_at: float
    runs: list[Run]
    messages: list[Message] | None = field(default=None)

    @property
    def updated_at(self) -> float:
        """The thread's last activity: the latest change of any of its runs."""
        return max(
            [self.created_at, *(max(r.updated_at, r.heartbeat_at or 0.0) for r in self.runs)]
        )


def place_run(
    conn: Connection,
    dialect: Dialect,
    *,
    thread_id: str,
    user_id: str,
    follow_up: bool,
    enqueue: bool,
    conversation: bool = True,
    start_at: float | None = None,
) -> tuple[RunState, int]:
    """The state a new run starts in and its place in ``thread_id``, inside the
    transaction that inserts it: a new thread's first run is ready at once; a follow-up
    (the thread's row locked first) is ready when the thread is idle, ``queued`` when it
    is busy and ``enqueue`` allows, else ``ThreadBusy`` names the run it would wait on.
    ``NotFound`` when the thread is not the user's; ``invalid_input`` when it is a child
    run's (reference §18: not a conversation; a child's own thread is made with
    ``conversation`` False). A ``start_at`` (epoch seconds) still ahead by the database's
    clock keeps the run ``queued``. Raising leaves nothing written."""
    params = {"b_thread": thread_id, "b_user": user_id}
    state, place = RunState.RUNNING, 1
    if not follow_up:
        conn.execute(_NEW_THREAD, {**params, "b_conversation": conversation})
    else:
        state, place = _follow(conn, dialect, params, enqueue=enqueue)
    if start_at is not None and conn.execute(_LATER_THAN_NOW, {"b_at": start_at}).scalar():
        state = RunState.QUEUED
    return state, place


def _follow(
    conn: Connection, dialect: Dialect, params: dict[str, Any], *, enqueue: bool
) -> tuple[RunState, int]:
    """A follow-up's state and place in its thread (``place_run``)."""
    found = conn.execute(dialect.lock(_ANY_OF_USER), params).first()
    if found is None:
        raise NotFound("no such thread")
    if not found.conversation:
        raise InvalidInput(
            "this thread is a sub-agent's run, not a conversation: follow up on its root's thread"
        )
    waited_on = conn.execute(_WAITED_ON, params).scalar()
    if waited_on is not None and not enqueue:
        raise ThreadBusy(
            "a run of this thread is still going; send again once it stops, or with "
            '"if_busy": "enqueue" to have it start then',
            run_id=waited_on,
        )
    place = int(conn.execute(_NEXT_PLACE, params).scalar_one())
    return (RunState.QUEUED if waited_on is not None else RunState.RUNNING), place


def moved_on(conn: Connection, dialect: Dialect, run_id: str) -> None:
    """Lock the thread of ``run_id`` and raise ``ThreadBusy`` (naming the later run) if
    its thread has gone on past it: continuing it would change what that later run saw."""
    found = conn.execute(_THREAD_OF_RUN, {"b_id": run_id}).first()
    if found is None or found.thread_id is None:
        return
    params = {"b_thread": found.thread_id, "b_pos": found.thread_pos}
    conn.execute(dialect.lock(_LOCK_THREAD), params)
    later = conn.execute(_LATER, params).scalar()
    if later is not None:
        raise ThreadBusy(
            "a later run of this thread has gone on from this one; fork this run to go on "
            "from it in a thread of its own",
            run_id=later,
        )


def thread_history(conn: Connection, run: Run) -> list[Message]:
    """In the caller's transaction: the conversation before ``run`` in its thread."""
    if run.thread_pos <= 1:
        return []
    params = {"b_thread": run.thread_id, "b_pos": run.thread_pos}
    return [dict(m) for m in conn.execute(_HISTORY, params).scalars()]


_LOCK_THREADS = sa.select(threads.c.id).where(
    threads.c.id.in_(sa.bindparam("b_threads", expanding=True))
)
_RECENT = runs.alias("recent")


def kept(thread: sa.ColumnElement[Any]) -> sa.Exists:
    """Whether ``thread`` has a run retention must keep: one still going (not halted or
    finished) or changed less than ``b_retention`` seconds ago, by the database's clock."""
    return (
        sa.select(_RECENT.c.id)
        .where(
            _RECENT.c.thread_id == thread,
            sa.or_(
                _RECENT.c.state.not_in([sa.literal_column(f"'{s.value}'") for s in RETAINED]),
                _RECENT.c.updated_at >= db_now() - sa.bindparam("b_retention", type_=sa.Float),
            ),
        )
        .exists()
    )


_STILL_PAST = sa.select(threads.c.id).where(
    threads.c.id.in_(sa.bindparam("b_threads", expanding=True)), ~kept(threads.c.id)
)


def still_idle(
    conn: Connection, dialect: Dialect, thread_ids: list[str], params: dict[str, Any]
) -> list[str]:
    """Of ``thread_ids``, those still past retention once their rows are locked (so no
    follow-up is being added to them): whoever adds a run to a thread locks it first."""
    if not thread_ids:
        return []
    found = {**params, "b_threads": thread_ids}
    conn.execute(dialect.lock(_LOCK_THREADS), found).all()
    return list(conn.execute(_STILL_PAST, found).scalars())


def delete_runs(conn: Connection, ids: Sequence[str]) -> int:
    """Delete the runs ``ids`` with everything of theirs (the approvals of their calls
    too, explicitly: no deletion depends on SQLite's foreign_keys pragma); how many runs
    went."""
    if not ids:
        return 0
    calls = sa.select(pending_calls.c.token_hash).where(pending_calls.c.run_id.in_(ids))
    conn.execute(approvals.delete().where(approvals.c.token_hash.in_(calls)))
    children = (run_messages, run_events, tool_calls, decisions, pending_calls, compactions)
    for table in children:
        conn.execute(table.delete().where(table.c.run_id.in_(ids)))
    return int(conn.execute(runs.delete().where(runs.c.id.in_(ids))).rowcount)


def delete_threads(conn: Connection, thread_ids: Sequence[str]) -> int:
    """Delete the threads ``thread_ids`` and all their runs, with the trees of sub-agents
    those runs are the roots of (their child runs and the children's threads, reference
    §18); how many runs went."""
    if not thread_ids:
        return 0
    params = {"b_threads": list(thread_ids)}
    roots = list(conn.execute(_IDS_OF_THREADS, params).scalars())
    below = conn.execute(_TREES_BELOW, {"b_roots": roots}).all() if roots else []
    gone = delete_runs(conn, [*roots, *(r.id for r in below)])
    doomed = [*thread_ids, *(r.thread_id for r in below if r.thread_id)]
    conn.execute(threads.delete().where(threads.c.id.in_(doomed)))
    return gone


class Threads(StoreBase):
    """Reading, listing and deleting threads."""

    def thread(self, thread_id: str, user_id: str | None) -> ThreadRecord | None:
        """``user_id``'s thread (any user's for None) with its runs and whole
        conversation, or None."""
        params = {"b_thread": thread_id, "b_user": user_id, "b_threads": [thread_id]}
        with self.engine.begin() as conn:
            row = conn.execute(_ANY_THREAD_ROW if user_id is None else _THREAD_ROW, params).first()
            if row is None:
                return None
            found = [Run.from_row(r._mapping) for r in conn.execute(_RUNS_OF, params)]
            messages = [dict(m) for m in conn.execute(_CONVERSATION, params).scalars()]
        return ThreadRecord(
            id=row.id, user_id=row.user_id, created_at=row.created_at, runs=found, messages=messages
        )

    def threads(self, user_id: str | None, limit: int) -> list[ThreadRecord]:
        """``user_id``'s threads (every user's for None), most recently active first, each
        with its runs."""
        listing = _EVERY_THREAD if user_id is None else _THREADS_OF_USER
        with self.engine.begin() as conn:
            rows = conn.execute(listing, {"b_user": user_id, "b_limit": limit}).all()
            ids = [r.id for r in rows]
            by_thread: dict[str, list[Run]] = {i: [] for i in ids}
            if ids:
                for r in conn.execute(_RUNS_OF, {"b_threads": ids}):
                    by_thread[r.thread_id].append(Run.from_row(r._mapping))
        return [
            ThreadRecord(id=r.id, user_id=r.user_id, created_at=r.created_at, runs=by_thread[r.id])
            for r in rows
        ]

    def delete_thread(self, thread_id: str, user_id: str) -> None:
        """Delete ``user_id``'s thread and everything of its runs, in one transaction.
        ``NotFound`` if it is not theirs; ``ThreadBusy`` (nothing deleted) while a run of
        it is running, suspended or queued."""
        params = {"b_thread": thread_id, "b_user": user_id}
        with self.begin() as conn:
            if conn.execute(self.dialect.lock(_THREAD_ROW), params).first() is None:
                raise NotFound("no such thread")
            waited_on = conn.execute(_WAITED_ON, params).scalar()
            if waited_on is not None:
                raise ThreadBusy(
                    "a run of this thread is still going; cancel it or wait until it stops",
                    run_id=waited_on,
                )
            delete_threads(conn, [thread_id])
