"""Reading runs and threads back for the ``Engine``: a run with its own messages, pages of
runs, a run's trace and ledger, threads. Nothing here changes anything."""

from __future__ import annotations

import dataclasses

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.budget import Budget, TreeNode, consumed_trees
from tether.errors import InvalidInput, NotFound
from tether.messages import tool_results
from tether.results import LiveEvent, RunPage, RunView, ThreadView, TreeView
from tether.runs import Run, RunState, answer_of
from tether.store import CallStatus, LedgerEntry, Store
from tether.trees import depth_first


def limit_of(limit: int) -> int:
    """A page's size: 1 to 1000, else ``invalid_input``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidInput("limit must be between 1 and 1000")
    return limit


async def run_view(services: Services, run_id: str, user: str | None) -> RunView:
    """A run with its messages, and a parent's children and ``consumed_tree``;
    ``not_found`` if missing or not ``user``'s."""
    snapshot = await hop(services.store.snapshot, inputs.run_id(run_id))
    if snapshot is None or (user is not None and snapshot.run.user_id != user):
        raise NotFound("no such run")
    # Its own messages: a fork of a follow-up also holds a copy of what came before.
    own = snapshot.messages[snapshot.run.base_count :]
    run = snapshot.run
    if run.state is RunState.ANSWERED and own:  # its final answer is its last message
        run = dataclasses.replace(run, answer=answer_of(own[-1]))
    if not _may_have_children(services, run):
        return RunView(run=run, messages=own)
    children, consumed = await hop(_family, services.store, run)
    return RunView(run=run, messages=own, children=children, consumed_tree=consumed)


def _may_have_children(services: Services, run: Run) -> bool:
    """Whether ``run`` may have started children (reference §18): its agent has
    sub-agents, it waits for children, or its version is none this engine knows. A run of
    an agent without sub-agents costs no read."""
    tree = services.agent.tree
    if run.state is RunState.WAITING or run.agent_version not in tree:
        return True
    return bool(tree[run.agent_version].subagents)


def _family(store: Store, run: Run) -> tuple[list[Run], Budget | None]:
    """The children of ``run`` in call order and, when it has any, its ``consumed_tree``."""
    children = store.children(run.id)
    if not children:
        return [], None
    return children, consumed_trees(store.tree_figures(run.root_run_id)).get(run.id)


async def tree_view(services: Services, run_id: str, user: str | None) -> TreeView:
    """The tree ``run_id`` belongs to (reference §18), depth first, a suspended run with
    every call it waits on (read with the tree); ``not_found`` if there is no such run or
    it is not ``user``'s."""
    found = await hop(services.store.tree, inputs.run_id(run_id))
    if not found or (user is not None and found[0].user_id != user):
        raise NotFound("no such run")
    nodes = [
        TreeNode(id=r.id, parent_id=r.parent_run_id, limits=r.limits, consumed=r.budget)
        for r in found
    ]
    root = found[0].root_run_id
    return TreeView(root_run_id=root, runs=depth_first(found), consumed=consumed_trees(nodes))


async def runs_page(
    services: Services, user: str | None, *, state: str | None, after: str | None, limit: int
) -> RunPage:
    """A page of runs, newest first, after the run ``after``; ``invalid_input`` for an
    unknown state or a cursor that names none of the runs listed."""
    whose = "the user's runs" if user is not None else "the runs"
    if after is not None and not (isinstance(after, str) and inputs.RUN_ID.fullmatch(after)):
        raise InvalidInput(f"there is no such page: after must name one of {whose}")
    found = await hop(
        services.store.runs_page,
        user,
        state=inputs.run_state(state) if state is not None else None,
        after=after,
        limit=limit_of(limit),
    )
    if found is None:
        raise InvalidInput(f"after must name one of {whose} (a page's last run)")
    return RunPage(runs=found[0], more=found[1])


async def events(services: Services, run_id: str) -> list[LiveEvent]:
    """The run's trace, oldest first, each event with its SEQ."""
    found = await hop(services.store.events, inputs.run_id(run_id))
    return [LiveEvent.of(event, seq) for seq, event in enumerate(found, start=1)]


async def ledger(services: Services, run_id: str) -> list[LedgerEntry]:
    """The run's ledger, each entry with the result the model saw: the store keeps a
    result once, in its message, and it is read from there."""
    return await hop(_ledger, services.store, inputs.run_id(run_id))


def _ledger(store: Store, run_id: str) -> list[LedgerEntry]:
    entries = store.ledger(run_id)
    answered = [e.seq for e in entries if e.result is None and e.status is not CallStatus.INTENT]
    if not answered:
        return entries
    seen = tool_results(store.messages(run_id, from_seq=min(answered)))
    return [
        dataclasses.replace(e, result=seen[e.tool_call_id])
        if e.result is None and e.tool_call_id in seen
        else e
        for e in entries
    ]


async def thread_view(services: Services, thread_id: str, user: str | None) -> ThreadView:
    """A thread with its runs and whole conversation; ``not_found`` if missing or not
    ``user``'s."""
    found = await hop(services.store.thread, inputs.thread_id(thread_id, missing=True), user)
    if found is None:
        raise NotFound("no such thread")
    return ThreadView.of(found)


async def threads(services: Services, user: str | None, limit: int) -> list[ThreadView]:
    """Threads, most recently active first, without their messages."""
    return [ThreadView.of(t) for t in await hop(services.store.threads, user, limit_of(limit))]
