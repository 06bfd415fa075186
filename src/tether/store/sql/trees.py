"""The statements of trees of sub-agents (reference §18), built once at import.

Lock order, the same on every path so two of them never wait on each other: a child's
row before its parent's, deeper runs before shallower ones. A child that stops locks its
own row (its transition), then its parent's (``LOCK_RUN``) before it reads whether any
sibling is still going, so of two last children stopping at once the second sees the
first stopped and wakes the parent. A parent that goes ``waiting`` locks its own row,
then inserts its children, and goes waiting only while one of them is still going.
"""

from __future__ import annotations

import sqlalchemy as sa

from tether.runs import TERMINAL, RunState
from tether.store.backend.clock import db_now
from tether.store.sql.schema import run_messages, runs
from tether.store.sql.steps import OWNS, RUNNING
from tether.store.sql.transitions import Transition, state_in

# An answered run's last message, its final answer (reference §6: a run's ``answer``), beside
# the run's columns; null for any other state. A lookup by the messages' primary key.
FINAL_MESSAGE = sa.case(
    (
        runs.c.state == RunState.ANSWERED.value,
        sa.select(run_messages.c.message)
        .where(run_messages.c.run_id == runs.c.id, run_messages.c.seq == runs.c.message_count - 1)
        .scalar_subquery(),
    ),
    else_=sa.null(),
).label("final_message")
_LIVE_STATES = [s for s in RunState if s not in TERMINAL]
_PARENT = runs.c.id == sa.bindparam("b_parent")

# A run's row, locked (``Dialect.lock``) before the rows that depend on it are read.
LOCK_RUN = sa.select(runs.c.id, runs.c.state).where(_PARENT)
# The lease of a running run, locked by a parent about to start its children.
LOCK_LEASED = sa.select(runs.c.id).where(OWNS, state_in([RUNNING]))

_child = runs.alias("child")
# Whether the run being updated has a child still going (correlated to the UPDATE's row).
_live_child = (
    sa.select(_child.c.id)
    .where(
        _child.c.parent_run_id == runs.c.id,
        _child.c.state.in_([sa.literal_column(f"'{s.value}'") for s in _LIVE_STATES]),
    )
    .exists()
)
# Any child of ``b_parent`` still going (not answered, failed or cancelled).
LIVE_CHILD = (
    sa.select(runs.c.id)
    .where(runs.c.parent_run_id == sa.bindparam("b_parent"), state_in(_LIVE_STATES))
    .limit(1)
)
# running → waiting for its children: no owner, no lease, no heartbeat (never an orphan).
WAIT = Transition(
    RUNNING,
    RunState.WAITING,
    OWNS,
    owner=None,
    heartbeat_at=None,
    ready_at=None,
    elapsed_ms=runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
    updated_at=db_now(),
)
# waiting → ready for a worker (running, no owner), once no child of it is still going.
WAKE = Transition(
    RunState.WAITING,
    RUNNING,
    _PARENT,
    ~_live_child,
    owner=None,
    ready_at=None,
    updated_at=db_now(),
)
# The parents of the runs ``b_ids`` that have one.
PARENTS = sa.select(runs.c.id, runs.c.parent_run_id).where(
    runs.c.id.in_(sa.bindparam("b_ids", expanding=True)), runs.c.parent_run_id.is_not(None)
)
# A run's children, in the order of the calls that started them.
CHILDREN = (
    sa.select(runs, FINAL_MESSAGE)
    .where(runs.c.parent_run_id == sa.bindparam("b_parent"))
    .order_by(runs.c.child_order, runs.c.started_at, runs.c.id)
)
# Every run of a tree, parents before children, siblings in call order.
TREE = (
    sa.select(runs, FINAL_MESSAGE)
    .where(runs.c.root_run_id == sa.bindparam("b_root"))
    .order_by(runs.c.depth, runs.c.child_order, runs.c.started_at, runs.c.id)
)
# The figures a tree's budget check reads of each run of the tree.
TREE_BUDGET = sa.select(
    runs.c.id,
    runs.c.parent_run_id,
    runs.c.route,
    runs.c.max_steps,
    runs.c.max_spend_usd,
    runs.c.max_tool_calls,
    runs.c.max_elapsed_ms,
    runs.c.steps,
    runs.c.spend_usd,
    runs.c.tool_calls,
    runs.c.elapsed_ms,
).where(runs.c.root_run_id == sa.bindparam("b_root"))
# Tool calls of a run of a tree counted before they run (fenced by the lease).
RESERVE_CALLS = (
    runs.update()
    .where(OWNS, state_in([RUNNING]))
    .values(tool_calls=runs.c.tool_calls + sa.bindparam("b_count", type_=sa.Integer))
    .returning(runs.c.id)
)
# The runs ``b_ids`` (a run and its ancestors), locked deepest first: the lock order.
LOCK_CHAIN = (
    sa.select(runs.c.id)
    .where(runs.c.id.in_(sa.bindparam("b_ids", expanding=True)))
    .order_by(runs.c.depth.desc())
)
# The root of the tree ``b_id`` belongs to.
ROOT_OF = sa.select(runs.c.root_run_id).where(runs.c.id == sa.bindparam("b_id"))
