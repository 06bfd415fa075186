"""The one budget check (invariant 4, reference §18): before a model call or a tool call, a
run's own consumption against the limits that bind it, then, in a tree of sub-agents, each
run's ``consumed_tree`` from this run up to its root against that run's limits; and the
counting, before they run, of a tree's writes, so that two runs of one tree never pass an
ancestor's limit between checking and counting.

The tree's figures a check reads are those the run's last counting write returned (its
turn, its reservation): no read per step. What other runs of the tree counted since is
seen at the next of those writes, which checks steps and tool calls exactly.

A halt names the run whose limits stopped it (``halted_by``: the run's own id, or an
ancestor's). Steps are held to their limit where they are stored (``store.persist_turn``
rolls back a step past an ancestor's ``max_steps``); spend and active time may pass a
limit by one model call per run of the tree that was running when it was reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from tether._runtime.hop import hop
from tether._runtime.step.session import RunSession
from tether.budget import tree_halt
from tether.errors import LeaseLost
from tether.messages import ToolCall
from tether.reasons import HaltReason
from tether.results import Outcome
from tether.store import StepRefused
from tether.store.trees import chain_of


async def budget_stop(
    session: RunSession, before: Literal["model", "tool"], count: int = 1
) -> Outcome | None:
    """Check the budget before a model call, or before ``count`` tool calls: halts the run
    (naming whose limits stopped it) and returns how, or None when it may go on."""
    run = session.run
    budget = session.budget.after_tool_calls(max(0, count - 1))
    if before == "model":
        reason = budget.check_before_model_call(session.trees.binding)
    else:
        reason = budget.check_before_tool_call(session.trees.binding)
    if reason is not None:
        return await session.halt(reason, halted_by=run.id)
    trees = session.trees
    if not trees.tree:
        return None
    nodes = trees.seen  # as the run's last write counted them: no read per step
    if nodes is None:
        nodes = await hop(session.services.store.tree_figures, run.root_run_id)
        trees.seen = nodes
    if trees.chain is None:
        trees.chain = chain_of(run.id, nodes)
    mine = [replace(n, consumed=budget) if n.id == run.id else n for n in nodes]
    root = next((n for n in nodes if n.parent_id is None), None)
    if root is not None:
        trees.root_limits = root.limits
    found = tree_halt(run.id, mine, before)
    if found is not None:
        return await session.halt(found[0], halted_by=found[1])
    return None


async def prepay(session: RunSession, calls: Sequence[ToolCall]) -> Outcome | None:
    """Before ``calls`` (writes) run in a run of a tree: count them now, checked against
    the tree with its runs locked (``store.reserve_tool_calls``); their results are then
    stored without counting them again. A halt when they would pass a limit. Elsewhere:
    only that the lease still holds (``LeaseLost``)."""
    run = session.run
    if not session.trees.tree:
        if not await session.lease_held():
            raise LeaseLost("this worker no longer owns the run", run_id=run.id)
        return None
    try:
        session.trees.seen = await hop(
            session.services.store.reserve_tool_calls,
            session.lease,
            count=len(calls),
            root_run_id=run.root_run_id,
            chain=session.trees.chain,
        )
    except StepRefused as refused:
        return await session.halt(HaltReason(refused.reason), halted_by=refused.halted_by)
    session.trees.prepaid.update(call.id for call in calls)
    session.budget = session.budget.after_tool_calls(len(calls))
    return None
