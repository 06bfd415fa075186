"""Trees of sub-agents (reference §18): a parent starting its children and going
``waiting`` in one transaction, a child's stop waking its parent in the transaction that
stops it, and reading a tree.

Why each is safe to run twice: a child is unique per (parent run, tool call id)
(``runs_child``), and only the parent's lease holder starts children (fenced), so a
recovered parent finds the children its dead owner stored and starts none again. Waking
is a transition from ``waiting`` (a second wake finds the parent no longer waiting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from tether.budget import Budget, Limits, TreeNode, binding, consumed_trees
from tether.errors import LeaseLost
from tether.reasons import HaltReason
from tether.runs import Lease, Run
from tether.store.backend.dialect import Dialect
from tether.store.base import StoreBase
from tether.store.creation import insert_run
from tether.store.sql.steps import add_event, lease_params
from tether.store.sql.trees import (
    CHILDREN,
    LIVE_CHILD,
    LOCK_CHAIN,
    LOCK_LEASED,
    LOCK_RUN,
    PARENTS,
    RESERVE_CALLS,
    ROOT_OF,
    TREE,
    TREE_BUDGET,
    WAIT,
    WAKE,
)
from tether.store.suspensions import with_calls


def stopped(conn: Connection, dialect: Dialect, run_ids: Sequence[str], state: str) -> None:
    """Runs ``run_ids`` just stopped (``state``: answered, failed or cancelled), in the
    caller's transaction: each one's parent gets ``child_stopped`` and, when no child of
    it is still going, is made ready for a worker (reference §18). Runs without a parent
    cost one read by key."""
    if not run_ids:
        return
    for row in conn.execute(PARENTS, {"b_ids": list(run_ids)}).all():
        params = {"b_parent": row.parent_run_id}
        conn.execute(dialect.lock(LOCK_RUN), params).first()  # a child before its parent
        add_event(conn, row.parent_run_id, "child_stopped", {"run_id": row.id, "state": state})
        if WAKE.one(conn, params) is not None:
            dialect.wake(conn)


def halted(conn: Connection, run_id: str, reason: str, halted_by: str | None) -> None:
    """A run just halted, in the caller's transaction: its parent, if any, gets
    ``child_halted`` (it keeps waiting: its owner continues or cancels the child)."""
    row = conn.execute(PARENTS, {"b_ids": [run_id]}).first()
    if row is not None:
        data = {"run_id": run_id, "halt_reason": reason, "halted_by": halted_by}
        add_event(conn, row.parent_run_id, "child_halted", data)


def descendants(conn: Connection, run_id: str) -> list[list[str]]:
    """The descendants of ``run_id`` by depth, deepest first (the lock order of trees)."""
    root = conn.execute(ROOT_OF, {"b_id": run_id}).scalar()
    if root is None:
        return []
    rows = conn.execute(TREE_BUDGET, {"b_root": root}).all()
    if len(rows) < 2:
        return []
    children: dict[str, list[str]] = {}
    for row in rows:
        if row.parent_run_id is not None:
            children.setdefault(row.parent_run_id, []).append(row.id)
    levels: list[list[str]] = []
    level = children.get(run_id, [])
    while level:
        levels.append(level)
        level = [c for parent in level for c in children.get(parent, [])]
    return levels[::-1]


class StepRefused(Exception):
    """A tree's step that would pass ``halted_by``'s ``max_steps``: the transaction that
    stored it rolls back, and the run halts instead (reference §18)."""

    def __init__(self, reason: str, halted_by: str) -> None:
        super().__init__(f"{reason} of {halted_by}")
        self.reason = reason
        self.halted_by = halted_by


def step_over(
    conn: Connection,
    dialect: Dialect,
    run_id: str,
    root_run_id: str,
    chain: Sequence[str] | None = None,
) -> list[TreeNode]:
    """Inside the transaction that just counted a step or tool calls of ``run_id`` (a turn,
    a read-only step's reads, a reservation of calls about to run): whether that took the
    run, or an ancestor's tree, past its ``max_steps`` or ``max_tool_calls`` (reference
    §18). Checked with the run and its ancestors locked (deepest first), so of two runs of
    one tree counting at once the second sees the first's: steps and tool calls never pass
    an ancestor's limit. ``StepRefused`` (the caller's transaction rolls back) names the
    halt reason and whose limits; else the tree's figures, as counted. ``chain``: the run
    and its ancestors, when the caller knows them (a tree's shape never changes), else
    read first."""
    read = {"b_root": root_run_id}
    if chain is None or not dialect.locks_rows:  # SQLite's transaction holds the write lock
        nodes = _figures(conn.execute(TREE_BUDGET, read).all())
        chain = chain_of(run_id, nodes) if chain is None else chain
    if dialect.locks_rows:
        conn.execute(dialect.lock(LOCK_CHAIN), {"b_ids": list(chain)}).all()
        nodes = _figures(conn.execute(TREE_BUDGET, read).all())
    totals = consumed_trees(nodes)
    limits = {n.id: n.limits for n in nodes}
    for member in chain:
        if totals[member].steps > limits[member].max_steps:
            raise StepRefused(HaltReason.MAX_STEPS.value, member)
        if totals[member].tool_calls > limits[member].max_tool_calls:
            raise StepRefused(HaltReason.MAX_TOOL_CALLS.value, member)
    return nodes


def chain_of(run_id: str, nodes: Sequence[TreeNode]) -> list[str]:
    """``run_id`` and its ancestors, nearest first, as ``nodes`` (a tree's) link them."""
    parent = {n.id: n.parent_id for n in nodes}
    chain: list[str] = []
    above: str | None = run_id
    while above is not None and above in parent and above not in chain:
        chain.append(above)
        above = parent[above]
    return chain


def _figures(rows: Sequence[Any]) -> list[TreeNode]:
    """Tree budget rows (``TREE_BUDGET``) as the budget check's nodes."""
    return [
        TreeNode(
            id=r.id,
            parent_id=r.parent_run_id,
            limits=binding(
                Limits(
                    max_steps=r.max_steps,
                    max_spend_usd=r.max_spend_usd,
                    max_tool_calls=r.max_tool_calls,
                    max_elapsed_ms=r.max_elapsed_ms,
                ),
                dict(r.route or {}),
                child=r.parent_run_id is not None,
            ),
            consumed=Budget(
                steps=r.steps,
                spend_usd=r.spend_usd,
                tool_calls=r.tool_calls,
                elapsed_ms=r.elapsed_ms,
            ),
        )
        for r in rows
    ]


class Trees(StoreBase):
    """Starting children, and reading trees."""

    def reserve_tool_calls(
        self, lease: Lease, *, count: int, root_run_id: str, chain: Sequence[str] | None = None
    ) -> list[TreeNode]:
        """Count ``count`` tool calls of a run of a tree before they run (reference §18),
        in one transaction fenced by the lease: ``StepRefused`` (nothing counted) when
        they would take the run or an ancestor's tree past its ``max_tool_calls``; else
        the tree's figures (``step_over``)."""
        with self.begin() as conn:
            return self._reserve(conn, lease, count, root_run_id, chain)

    def _reserve(
        self,
        conn: Connection,
        lease: Lease,
        count: int,
        root_run_id: str,
        chain: Sequence[str] | None = None,
    ) -> list[TreeNode]:
        params = {**lease_params(lease), "b_count": count}
        if conn.execute(RESERVE_CALLS, params).first() is None:
            raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
        return step_over(conn, self.dialect, lease.run_id, root_run_id, chain)

    def start_children(
        self,
        lease: Lease,
        *,
        children: Sequence[dict[str, Any]],
        elapsed_ms: int,
        root_run_id: str,
    ) -> bool:
        """Store the parent's new ``children`` (each ``insert_run``'s fields, with its
        ``parent``) with a ``child_started`` event each, count their calls as the parent's
        tool calls (``StepRefused``, nothing stored, past a limit of its tree), and move
        the parent to ``waiting`` while any child of it is still going, in one transaction
        fenced by the lease (``LeaseLost``). Whether it now waits (False: every child had
        already stopped, and the parent goes on holding its lease)."""
        with self.begin() as conn:
            if conn.execute(self.dialect.lock(LOCK_LEASED), lease_params(lease)).first() is None:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            if children:
                self._reserve(conn, lease, len(children), root_run_id)
            for fields in children:
                child = insert_run(conn, self.dialect, **fields)
                started = {
                    "run_id": child.id,
                    "tool_call_id": child.parent_tool_call_id,
                    "agent": fields["route"].get("agent"),
                }
                add_event(conn, lease.run_id, "child_started", started)
            if conn.execute(LIVE_CHILD, {"b_parent": lease.run_id}).first() is None:
                return False
            params = {**lease_params(lease), "b_elapsed": elapsed_ms}
            if WAIT.one(conn, params) is None:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            return True

    def children(self, run_id: str) -> list[Run]:
        """The children of ``run_id``, in the order of the calls that started them."""
        with self.reading() as conn:
            found = conn.execute(CHILDREN, {"b_parent": run_id}).all()
        return [Run.from_row(r._mapping) for r in found]

    def tree(self, run_id: str) -> list[Run]:
        """Every run of the tree ``run_id`` belongs to, parents before children, siblings
        in call order, a suspended one with every call its suspension waits on; empty when
        there is no such run."""
        with self.reading() as conn:
            root = conn.execute(ROOT_OF, {"b_id": run_id}).scalar()
            if root is None:
                return []
            found = conn.execute(TREE, {"b_root": root}).all()
            return with_calls(conn, [Run.from_row(r._mapping) for r in found])

    def tree_figures(self, root_run_id: str) -> list[TreeNode]:
        """The limits and consumption of every run of a tree, for its budget check."""
        with self.reading() as conn:
            return _figures(conn.execute(TREE_BUDGET, {"b_root": root_run_id}).all())
