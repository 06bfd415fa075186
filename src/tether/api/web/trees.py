"""A tree of sub-agents on a run's page (reference §18): every run of the tree the run
belongs to, each under the run that started it, with its agent, its state in words (a
halted run: why and, for a budget, whose limits stopped it) and a link to its page, the
shown run marked; and, on the root's page, every call of the tree that waits for a
decision, each with the forms its own run's page shows, posting to that run. A tree is
its owner's alone (a child belongs to its parent's user), so is every run it links to;
a run that is alone in its tree shows nothing of one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tether.api.web import timeline
from tether.api.web.deciders import who_may
from tether.api.web.pages import TurnView, turn_view
from tether.api.web.status import state_note
from tether.budget import Budget
from tether.engine import Engine
from tether.errors import NotFound
from tether.runs import Run, RunState

# The events of a person's decision on a call.
_DECISIONS = frozenset({"approved", "declined", "edited"})


@dataclass(frozen=True, kw_only=True)
class Node:
    """One run of the tree as its page lists it, with the runs it started in call order."""

    run: Run
    agent: str
    note: str
    current: bool
    # The run whose limits halted this one and its agent, when another run's did (an
    # ancestor's; None otherwise).
    halted_by: Run | None
    halted_by_agent: str
    # How many calls of its suspension wait for a decision (0 unless suspended).
    waits: int
    # Halted (not by another run's limits) while the run that started it waits for it:
    # its owner continues or cancels it from its own page.
    holds_parent: bool
    # Its latest decision in words ("approved by dana"), for a run that is not the page's
    # own (whose timeline says it); empty if it has none.
    decided: str
    children: tuple[Node, ...]


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """A run of the tree whose turn waits for decisions, as the root's page shows it."""

    agent: str
    turn: TurnView
    # The run that started it, when that is not the root (whose page this is).
    parent: Node | None


@dataclass(frozen=True, kw_only=True)
class TreePanel:
    """The tree of the run a page shows: its root node, how many runs it has, and (on the
    root's page only) the turns of its other runs that wait for decisions, in tree order;
    for a run that started others, its consumption with theirs (``consumed_tree``), how
    many of the runs below it have not stopped (a cancel stops them too), and how many its
    limits halted (a grant to it resumes them)."""

    root: Node
    size: int
    on_root: bool
    waiting: tuple[Waiting, ...]
    consumed_tree: Budget | None
    going_below: int
    # How many runs of the tree its limits halted (continuing it resumes them).
    holding: int

    @property
    def calls(self) -> int:
        """How many calls of the tree's other runs the root's page asks to decide."""
        return sum(item.turn.waiting for item in self.waiting)


def agent_of(run: Run) -> str:
    """The name of the agent a run of a tree runs (its sub-agent's, for a child)."""
    return str(run.route.get("agent") or "agent")


def _in_order(runs: Sequence[Run]) -> list[Run]:
    """The runs each under the run that started it, siblings in the order given (call
    order): the order an indented list reads them."""
    children: dict[str | None, list[Run]] = {}
    ids = {run.id for run in runs}
    for run in runs:
        parent = run.parent_run_id if run.parent_run_id in ids else None
        children.setdefault(parent, []).append(run)
    ordered: list[Run] = []

    def visit(parent: str | None) -> None:
        for child in children.get(parent, ()):
            ordered.append(child)
            visit(child.id)

    visit(None)
    return ordered


async def tree_panel(engine: Engine, run: Run, viewer: str, now: float) -> TreePanel | None:
    """The tree ``run`` belongs to as its owner ``viewer`` sees it at the database's
    ``now``; None when the run is alone in its tree (or the tree is none of theirs)."""
    try:
        tree = await engine.get_tree(run.id, user=viewer)
    except NotFound:
        return None
    if len(tree.runs) < 2:
        return None
    runs = _in_order(tree.runs)
    # The shown run as the page read it, so the tree and the page agree on it.
    by_id = {r.id: (run if r.id == run.id else r) for r in runs}
    on_root = run.id == tree.root_run_id
    turns: dict[str, TurnView] = {}
    if on_root:
        for other in runs:
            if other.id != run.id and other.state is RunState.SUSPENDED:
                turn = await _turn_of(engine, other.id, viewer, now)
                if turn is not None:
                    turns[other.id] = turn

    decided = {r.id: await _last_decision(engine, r.id) for r in runs if r.id != run.id}
    nodes: dict[str, Node] = {}

    def node(of: Run) -> Node:
        halted = of.state is RunState.HALTED
        halted_by = by_id.get(of.halted_by or "") if halted and of.halted_by != of.id else None
        parent = by_id.get(of.parent_run_id or "")
        nodes[of.id] = Node(
            run=of,
            agent=agent_of(of),
            note=state_note(of, now),
            current=of.id == run.id,
            halted_by=halted_by,
            halted_by_agent=agent_of(halted_by) if halted_by is not None else "",
            waits=of.undecided if of.state is RunState.SUSPENDED else 0,
            holds_parent=halted
            and halted_by is None
            and parent is not None
            and parent.state is RunState.WAITING,
            decided=decided.get(of.id, ""),
            children=tuple(node(c) for c in runs if c.parent_run_id == of.id),
        )
        return nodes[of.id]

    root = node(by_id.get(tree.root_run_id, runs[0]))
    waiting = tuple(
        Waiting(
            agent=agent_of(r),
            turn=turns[r.id],
            parent=nodes.get(r.parent_run_id or "") if r.parent_run_id != root.run.id else None,
        )
        for r in runs
        if r.id in turns
    )
    below = _below(root, run.id)
    return TreePanel(
        root=root,
        size=len(runs),
        on_root=on_root,
        waiting=waiting,
        consumed_tree=tree.consumed.get(run.id) if below else None,
        going_below=sum(1 for n in below if not n.run.state.terminal),
        holding=sum(1 for r in runs if r.state is RunState.HALTED and r.halted_by == run.id),
    )


def _below(root: Node, run_id: str) -> list[Node]:
    """Every node under ``run_id``'s, in tree order."""

    def walk(at: Node, inside: bool) -> list[Node]:
        found = [at] if inside else []
        for child in at.children:
            found += walk(child, inside or at.run.id == run_id)
        return found

    return walk(root, False)


async def _last_decision(engine: Engine, run_id: str) -> str:
    """The run's latest decision on a call, as its timeline words it (in lower case, to
    follow the state on its line); empty if none."""
    events = await engine.events(run_id)
    found = next((e for e in reversed(events) if e.kind in _DECISIONS), None)
    if found is None:
        return ""
    what = timeline.line(found).what
    return what[:1].lower() + what[1:]


async def _turn_of(engine: Engine, run_id: str, viewer: str, now: float) -> TurnView | None:
    """The turn a run of the tree waits on, read with every call of its suspension."""
    try:
        found = (await engine.get_run(run_id, user=viewer)).run
    except NotFound:  # purged or cancelled away meanwhile
        return None
    who = await who_may(engine, [found])
    return turn_view(found, viewer, now, agent=engine.agent, who=who)
