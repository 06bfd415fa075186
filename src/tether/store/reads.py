"""Reads: runs, their messages, trace, ledger and decisions, and the database's clock.

The store hands messages back as stored; it does not interpret their shape (the loop
knows the chat format, the store does not).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from tether.models.base import Message
from tether.runs import Pending, Run, RunState
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.compaction import CompactionRecord, compaction_state
from tether.store.records import Decision, Event, LedgerEntry
from tether.store.sql.schema import (
    COUNTABLE,
    decisions,
    run_events,
    run_messages,
    runs,
    tool_calls,
)
from tether.store.sql.transitions import state_in
from tether.store.sql.trees import FINAL_MESSAGE
from tether.store.suspensions import (
    asked_of_rows,
    calls_of_rows,
    decision_of,
    with_calls,
    with_counts,
)

_NOW = sa.select(db_now())

_RUNS = sa.select(runs, FINAL_MESSAGE)
_RUN = _RUNS.where(runs.c.id == sa.bindparam("b_id"))

# Open suspensions (suspended, inside their window): their owners, a page of them soonest
# expiry first, and how many there are, each of everyone's or of some owners' only.
_OPEN = sa.and_(state_in([RunState.SUSPENDED]), runs.c.expires_at > sa.bindparam("b_now"))
_OF_OWNERS = runs.c.user_id.in_(sa.bindparam("b_owners", expanding=True))
_OPEN_OWNERS = sa.select(runs.c.user_id).where(_OPEN).distinct()


# A page of open requests starts after the cursor (``b_exp``, ``b_after``): the last
# request of the page before, in the page order (soonest expiry, then id).
_AFTER_CURSOR = sa.or_(
    runs.c.expires_at > sa.bindparam("b_exp"),
    sa.and_(runs.c.expires_at == sa.bindparam("b_exp"), runs.c.id > sa.bindparam("b_after")),
)


# The live feed's round (``events_of_runs``): the states of the runs it reads, and their
# events, each run after its own cursor (``b_r{i}``, ``b_l{i}``).
_STATES_OF = sa.select(runs.c.id, runs.c.state).where(
    runs.c.id.in_(sa.bindparam("b_ids", expanding=True))
)


@functools.lru_cache(maxsize=64)
def _events_of(count: int) -> sa.Select[Any]:
    """The events of ``count`` runs after their cursors, oldest first, ``b_limit`` at most:
    one statement per number of runs, built and compiled once (a feed reads every 50 ms
    while its runs are busy; building the statement each time cost more than reading)."""
    after = sa.or_(
        *(
            sa.and_(
                run_events.c.run_id == sa.bindparam(f"b_r{i}"),
                run_events.c.id > sa.bindparam(f"b_l{i}"),
            )
            for i in range(count)
        )
    )
    limit = sa.bindparam("b_limit", type_=sa.Integer)
    return sa.select(run_events).where(after).order_by(run_events.c.id).limit(limit)


def _open_page(*where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    return (
        sa.select(runs)
        .where(*where)
        .order_by(runs.c.expires_at, runs.c.id)
        .limit(sa.bindparam("b_limit", type_=sa.Integer))
    )


def _count(*where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    return sa.select(sa.func.count()).select_from(runs).where(*where)


# (owners given, after a cursor) -> the page's statement
_OPEN_PAGES = {
    (False, False): _open_page(_OPEN),
    (False, True): _open_page(_OPEN, _AFTER_CURSOR),
    (True, False): _open_page(_OPEN, _OF_OWNERS),
    (True, True): _open_page(_OPEN, _OF_OWNERS, _AFTER_CURSOR),
}
_COUNT_OPEN_AFTER = {
    False: _count(_OPEN, _AFTER_CURSOR),
    True: _count(_OPEN, _OF_OWNERS, _AFTER_CURSOR),
}

_RUN_STARTED = sa.select(runs.c.started_at, runs.c.user_id).where(runs.c.id == sa.bindparam("b_id"))


def _page_where(
    user_id: str | None, state: RunState | None, after: tuple[float, str] | None
) -> list[sa.ColumnElement[bool]]:
    """The runs of a page of ``runs_page``: top-level runs (a child is read through its
    tree, reference §18), the user's (everyone's for None), in ``state``, after ``after``
    (``started_at``, ``id``) in the page order (newest first, then by id). A plain column
    test, so the user's index (``user_id``, ``started_at``) still serves the page."""
    where: list[sa.ColumnElement[bool]] = [runs.c.parent_run_id.is_(None)]
    if user_id is not None:
        where.append(runs.c.user_id == user_id)
    if state is not None:
        where.append(runs.c.state == state.value)
    if after is not None:
        started, run_id = after
        where.append(
            sa.or_(
                runs.c.started_at < started,
                sa.and_(runs.c.started_at == started, runs.c.id > run_id),
            )
        )
    return where


def page_of(
    user_id: str | None, state: RunState | None, after: tuple[float, str] | None, limit: int
) -> sa.Select[Any]:
    """The statement of a page of ``runs_page`` (``_page_where``), newest first."""
    query = _RUNS.where(*_page_where(user_id, state, after))
    return query.order_by(runs.c.started_at.desc(), runs.c.id).limit(limit)


_DECISION_OF_CALL = (
    sa.select(decisions)
    .where(
        decisions.c.run_id == sa.bindparam("b_id"),
        decisions.c.tool_call_id == sa.bindparam("b_call"),
    )
    .order_by(decisions.c.decided_at.desc())
    .limit(1)
)

_EVENTS = (
    sa.select(run_events)
    .where(run_events.c.run_id == sa.bindparam("b_id"))
    .order_by(run_events.c.id)
)
# The run's state with its events after the one with id ``b_last``, skipping the first
# ``b_skip`` of them, in one query (a run without such events is one row of NULL event
# columns): a watcher starts with (0, SEQ) and goes on with (the last id it saw, 0). Events
# of a run are written only in transactions that hold the run's row, so they commit in id
# order and an event's SEQ (its ordinal in its run) never changes once visible (reference §11).
_EVENTS_AFTER = (
    sa.select(runs.c.state.label("run_state"), run_events)
    .select_from(
        runs.outerjoin(
            run_events,
            sa.and_(run_events.c.run_id == runs.c.id, run_events.c.id > sa.bindparam("b_last")),
        )
    )
    .where(runs.c.id == sa.bindparam("b_id"))
    .order_by(run_events.c.id)
    .limit(sa.bindparam("b_limit", type_=sa.Integer))
    .offset(sa.bindparam("b_skip", type_=sa.Integer))
)
# A run's messages from position ``b_from`` on.
_MESSAGES_FROM = (
    sa.select(run_messages.c.message)
    .where(
        run_messages.c.run_id == sa.bindparam("b_id"), run_messages.c.seq >= sa.bindparam("b_from")
    )
    .order_by(run_messages.c.seq)
)
_STATE = sa.select(runs.c.state).where(runs.c.id == sa.bindparam("b_id"))
_LEDGER = (
    sa.select(tool_calls)
    .where(tool_calls.c.run_id == sa.bindparam("b_id"))
    .order_by(tool_calls.c.seq)
)

# Served by the partial index on runs(state) alone (its predicate, stated here).
_COUNT_BY_STATE = (
    sa.select(runs.c.state, sa.func.count()).where(sa.text(COUNTABLE)).group_by(runs.c.state)
)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A run with what the loop needs to go on: its messages, and the decisions its
    suspensions' calls carry, by tool call id (the latest of a call's). Which of them
    answer a pending call is the caller's to check."""

    run: Run
    messages: list[Message]
    decisions: dict[str, Decision] = field(default_factory=dict)
    # What the run's suspensions asked of each call, by tool call id (the latest's).
    asked: dict[str, Pending] = field(default_factory=dict)
    # The conversation before the run in its thread (reference §14), when asked for; with
    # it, the compaction the model sees it through and the input tokens the conversation's
    # latest model call reported (``compaction.compaction_state``).
    history: list[Message] = field(default_factory=list)
    compaction: CompactionRecord | None = None
    input_tokens: int = 0


class Reads(StoreBase):
    """Every read of the store."""

    def now(self) -> float:
        """The database's clock, in epoch seconds (invariant 11: one clock)."""
        with self.engine.connect() as conn:
            return float(conn.execute(_NOW).scalar_one())

    def get_run(self, run_id: str) -> Run | None:
        with self.reading() as conn:
            row = conn.execute(_RUN, {"b_id": run_id}).first()
            return with_calls(conn, [Run.from_row(row._mapping)])[0] if row else None

    def messages(self, run_id: str, *, from_seq: int = 0) -> list[Message]:
        """The run's messages, in order, as the model saw them; from position ``from_seq``
        on when it is given."""
        params = {"b_id": run_id, "b_from": from_seq}
        with self.engine.connect() as conn:
            return [dict(m) for m in conn.execute(_MESSAGES_FROM, params).scalars()]

    def snapshot(
        self, run_id: str, *, history: bool = False, compacts: bool = False
    ) -> Snapshot | None:
        """The run (with its suspension's calls), its messages and the decisions its
        suspensions' calls carry, in one read (``snapshots``: one statement on
        PostgreSQL), so the messages belong to the run row read. With ``history``, the
        thread's conversation before the run too (its earlier runs' messages); with
        ``compacts`` (its agent compacts), the compaction state of that conversation, in a
        second statement (so a resumption on any worker hands the model what it saw
        before)."""
        with self.reading() as conn:
            loaded = self.dialect.read_run(conn, run_id, history=history)
            if loaded is None:
                return None
            rows = loaded.rows
            row = rows[0]
            run = with_counts(conn, calls_of_rows(Run.from_row(row._mapping), rows))
            made = sorted(filter(None, map(decision_of, rows)), key=lambda d: d.at)
            compaction, tokens = None, 0
            if compacts:
                compaction, tokens = compaction_state(conn, run, row.last_input_tokens)
            return Snapshot(
                run=run,
                messages=loaded.messages,
                decisions={d.tool_call_id: d for d in made},
                asked=asked_of_rows(rows),
                history=loaded.earlier,
                compaction=compaction,
                input_tokens=tokens,
            )

    def list_runs(self, user_id: str | None = None, limit: int = 100) -> list[Run]:
        """The newest runs first, of one user or of everyone."""
        query = _RUNS.order_by(runs.c.started_at.desc(), runs.c.id).limit(limit)
        if user_id is not None:
            query = query.where(runs.c.user_id == user_id)
        with self.engine.connect() as conn:
            return [Run.from_row(r._mapping) for r in conn.execute(query)]

    def runs_page(
        self, user_id: str | None, *, state: RunState | None, after: str | None, limit: int
    ) -> tuple[list[Run], int] | None:
        """One page of a user's top-level runs (everyone's for None), newest first (only
        those in ``state`` if given),
        after the run ``after`` (the last of the page before: a keyset cursor, so runs
        started meanwhile never shift a page); and how many more follow it. None when
        ``after`` is none of the user's runs (never theirs, or purged). One transaction."""
        with self.engine.begin() as conn:
            anchor = None
            if after is not None:
                found = conn.execute(_RUN_STARTED, {"b_id": after}).first()
                if found is None or (user_id is not None and found.user_id != user_id):
                    return None
                anchor = (float(found.started_at), after)
            page = [
                Run.from_row(r._mapping)
                for r in conn.execute(page_of(user_id, state, anchor, limit))
            ]
            more = 0
            if len(page) == limit:
                last = (page[-1].started_at, page[-1].id)
                rest = (
                    sa.select(sa.func.count())
                    .select_from(runs)
                    .where(*_page_where(user_id, state, last))
                )
                more = int(conn.execute(rest).scalar_one())
            return page, more

    def open_suspension_owners(self) -> tuple[list[str], float]:
        """The users who own an open suspension (suspended, inside its window), and the
        database's clock they were judged by."""
        with self.engine.begin() as conn:
            now = float(conn.execute(_NOW).scalar_one())
            owners = conn.execute(_OPEN_OWNERS, {"b_now": now}).scalars()
            return sorted(owners), now

    def open_suspensions(
        self,
        limit: int,
        *,
        owners: list[str] | None = None,
        after: tuple[float, str] | None = None,
    ) -> tuple[list[Run], int, float]:
        """A page of the suspended runs still inside their approval window (of ``owners``
        only, when given), soonest expiry first: at most ``limit`` after the cursor
        ``after`` (``expires_at``, ``id`` of the last of the page before: a keyset, so
        requests decided meanwhile never shift a page); how many more follow it; and the
        database's clock they were judged by. Served by the partial index on suspended
        runs' ``expires_at``, so finished runs never weigh on it."""
        if owners is not None and not owners:
            return [], 0, self.now()
        of_owners = owners is not None
        with self.engine.begin() as conn:
            now = float(conn.execute(_NOW).scalar_one())
            bound: dict[str, Any] = {"b_now": now}
            if owners is not None:
                bound["b_owners"] = owners
            cursor = {} if after is None else {"b_exp": after[0], "b_after": after[1]}
            page = _OPEN_PAGES[of_owners, after is not None]
            rows = conn.execute(page, {**bound, **cursor, "b_limit": limit})
            found = with_calls(conn, [Run.from_row(r._mapping) for r in rows])
            more = 0
            if len(found) == limit and found[-1].expires_at is not None:
                last = {"b_exp": found[-1].expires_at, "b_after": found[-1].id}
                more = int(
                    conn.execute(_COUNT_OPEN_AFTER[of_owners], {**bound, **last}).scalar_one()
                )
            return found, more, now

    def decision_for_call(self, run_id: str, tool_call_id: str) -> Decision | None:
        """The latest decision taken on a call of a run, if any."""
        with self.engine.connect() as conn:
            row = conn.execute(_DECISION_OF_CALL, {"b_id": run_id, "b_call": tool_call_id}).first()
            return Decision.from_row(row._mapping) if row else None

    def events(self, run_id: str) -> list[Event]:
        """The run's trace, oldest first."""
        with self.engine.connect() as conn:
            return [Event.from_row(r._mapping) for r in conn.execute(_EVENTS, {"b_id": run_id})]

    def events_after(
        self, run_id: str, *, last_id: int, skip: int, limit: int
    ) -> tuple[RunState | None, list[Event]]:
        """The run's state (None if there is no such run) and up to ``limit`` of its
        events after the one with id ``last_id``, skipping ``skip`` of them, read
        together: when the state is terminal, every event the run will have is in this
        read or a later one (a watcher closes after an incomplete batch of such a run)."""
        params = {"b_id": run_id, "b_last": last_id, "b_skip": skip, "b_limit": limit}
        with self.engine.connect() as conn:
            rows = conn.execute(_EVENTS_AFTER, params).all()
            if not rows:  # no such run, or ``skip`` passed every event it has
                state = conn.execute(_STATE, params).scalar()
                return (None if state is None else RunState(state)), []
            events = [Event.from_row(r._mapping) for r in rows if r.id is not None]
            return RunState(rows[0].run_state), events

    def events_of_runs(
        self, cursors: dict[str, int], *, limit: int
    ) -> tuple[dict[str, RunState], list[Event]]:
        """For many runs at once (live event streams, ``tether._runtime.live.events``): their
        states, then up to ``limit`` of their events, oldest first, after the id each run is
        mapped to. A run missing from the states is gone. The states are read first, so a run
        whose state is terminal has all its events in this read or a later one."""
        if not cursors:
            return {}, []
        params: dict[str, Any] = {"b_ids": list(cursors), "b_limit": limit}
        for i, (run_id, last) in enumerate(cursors.items()):
            params[f"b_r{i}"], params[f"b_l{i}"] = run_id, last
        with self.reading() as conn:
            found = conn.execute(_STATES_OF, params)
            states = {str(run_id): RunState(state) for run_id, state in found}
            rows = conn.execute(_events_of(len(cursors)), params)
            return states, [Event.from_row(r._mapping) for r in rows]

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        """The run's tool calls in the order they were asked for. A call that has a result
        message holds no copy of it here (``result`` None: the engine reads it from the
        message); a call failed ``unknown``, which has none, holds why."""
        with self.engine.connect() as conn:
            rows = conn.execute(_LEDGER, {"b_id": run_id})
            return [LedgerEntry.from_row(r._mapping) for r in rows]

    def count_by_state(self) -> dict[str, int]:
        """How many runs are in each state, every state present (zero when none)."""
        counts = {state.value: 0 for state in RunState}
        with self.engine.connect() as conn:
            for state, count in conn.execute(_COUNT_BY_STATE):
                counts[str(state)] = int(count)
        return counts
