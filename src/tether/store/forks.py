"""Forks (reference §12): a new run made of another run's messages through a step, and the
list of a run's forks.

A fork is one transaction: the parent's row is locked (so it cannot start running and
append messages meanwhile), its messages are read and cut at the step boundary, and the
new run is inserted halted (``forked``) with its copy of the messages and its ``forked``
event. The parent is not changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.budget import Limits, within_cap
from tether.errors import InvalidInput, NotFound
from tether.models.base import Message
from tether.reasons import HaltReason
from tether.runs import Run, RunState
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import run_events, runs
from tether.store.sql.steps import INSERT_MESSAGE, SELECT_MESSAGES, add_event
from tether.store.threads import place_run, thread_history
from tether.store.users import admit

# How many of a run's messages are "through step K" (``tether._runtime.forks.step_boundary``);
# raises ``InvalidInput`` when K is not a boundary.
Boundary = Callable[[Sequence[Message], Any], int]

_PARENT = sa.select(runs).where(
    runs.c.id == sa.bindparam("b_id"), runs.c.user_id == sa.bindparam("b_user")
)
# In the order they were made: their ``forked`` events' ids (times may tie on SQLite).
_FORKS = (
    sa.select(runs)
    .join(run_events, sa.and_(run_events.c.run_id == runs.c.id, run_events.c.kind == "forked"))
    .where(runs.c.forked_from_run == sa.bindparam("b_id"))
    .order_by(run_events.c.id)
)


def _own_place(new_id: str) -> dict[str, Any]:
    """A fork's place: a thread of its own, and a tree of its own (a fork of a child run is
    a top-level run, reference §18)."""
    return {"thread_id": new_id, "thread_pos": 1, "root_run_id": new_id}


# What a fork takes from its parent as it is; its budget and its place are its own.
_COPIED = (
    "user_id",
    "question",
    "route",
    "max_steps",
    "max_spend_usd",
    "max_tool_calls",
    "max_elapsed_ms",
    "scope_snapshot",
    "scope_resolved_at",
    "versions",
    "agent_version",
)


def _copy(
    conn: Connection, source: Run, boundary: Boundary, at_step: Any
) -> tuple[list[Message], list[Message]]:
    """What a fork of ``source`` through step ``at_step`` holds: (what the run saw before its
    own turns, all of it). Steps count the run's own turns; what it saw before them (the
    earlier runs of its thread, and any copy it holds itself) goes first, into the fork's
    new thread."""
    messages = [dict(m) for m in conn.execute(SELECT_MESSAGES, {"b_id": source.id}).scalars()]
    base = [*thread_history(conn, source), *messages[: source.base_count]]
    own_cut = boundary(messages[source.base_count :], at_step)
    return base, [*base, *messages[source.base_count : source.base_count + own_cut]]


class Forks(StoreBase):
    """Forking a run at a step, and listing a run's forks."""

    def fork_run(
        self,
        *,
        run_id: str,
        user_id: str,
        new_id: str,
        at_step: Any,
        dry_run: bool,
        by: str,
        boundary: Boundary,
        cap: Limits,
        trace_context: dict[str, str] | None = None,
    ) -> Run:
        """Insert ``new_id``: ``user_id``'s run ``run_id`` through step ``at_step``
        (``boundary`` cuts its messages), halted (``forked``), with the parent's limits
        and nothing consumed, its ``agent_version``, and the lineage. ``NotFound`` if the
        run is missing or not the user's; ``InvalidInput`` if it is running, ``at_step`` is
        not a boundary, or its limits are over ``cap``, or the user was removed (nothing
        is written)."""
        with self.begin() as conn:
            admit(conn, self.dialect, user_id)  # the user's row first, as a creation does
            parent = conn.execute(
                self.dialect.lock(_PARENT), {"b_id": run_id, "b_user": user_id}
            ).first()
            if parent is None:
                raise NotFound("no such run")
            if parent.state == RunState.RUNNING.value:
                raise InvalidInput(
                    "a running run cannot be forked; fork it once it has stopped", state="running"
                )
            source = Run.from_row(parent._mapping)
            within_cap(source.limits, cap, "the run's limits (a fork's)")
            base, copied = _copy(conn, source, boundary, at_step)
            place_run(
                conn,
                self.dialect,
                thread_id=new_id,
                user_id=user_id,
                follow_up=False,
                enqueue=False,
            )
            row = conn.execute(
                runs.insert()
                .values(
                    id=new_id,
                    **{name: parent._mapping[name] for name in _COPIED},
                    state=RunState.HALTED.value,
                    halt_reason=HaltReason.FORKED.value,
                    step=at_step,
                    message_count=len(copied),
                    **_own_place(new_id),
                    base_count=len(base),
                    forked_from_run=run_id,
                    forked_from_step=at_step,
                    dry_run=dry_run,
                    trace_context=trace_context,
                    started_at=db_now(),
                    updated_at=db_now(),
                )
                .returning(runs)
            ).one()
            if copied:
                conn.execute(
                    INSERT_MESSAGE,
                    [{"run_id": new_id, "seq": i, "message": m} for i, m in enumerate(copied)],
                )
            event = {"from_run_id": run_id, "step": at_step, "dry_run": dry_run, "by": by}
            add_event(conn, new_id, "forked", event)
            return Run.from_row(row._mapping)

    def forks_of(self, run_id: str) -> list[Run]:
        """The runs forked from ``run_id``, oldest first."""
        with self.engine.connect() as conn:
            return [Run.from_row(r._mapping) for r in conn.execute(_FORKS, {"b_id": run_id})]
