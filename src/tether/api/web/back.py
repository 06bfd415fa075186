"""The way back to the run from a page that answers a decision (approved, declined,
recorded, changed, refused): which run it was (its question, whose it is), and a link to
its page when the viewer may open it (its owner always; an approver while a call of it
waits for them, reference §6), and for its owner the page of its tree's root when it is a
sub-agent's run (reference §18). Only someone the run concerns learns which run it was:
its owner, an approver it waits on, or someone who decided one of its calls."""

from __future__ import annotations

from dataclasses import dataclass

from tether.engine import Engine
from tether.errors import InvalidInput, NotFound, UnknownOrExpired
from tether.runs import Run, RunState

# The events that record a person's decision on a call, with ``by``.
_DECISIONS = frozenset({"approved", "declined"})


@dataclass(frozen=True, kw_only=True)
class RunLink:
    """The run a result page answers for: shown by its question and owner, linked when
    ``openable`` (else the page says why not)."""

    id: str
    question: str
    owner: str
    openable: bool
    # The root of the run's tree of sub-agents when the run is a child and the viewer its
    # owner (whose root's page shows every request of the tree, reference §18); else None.
    root: str | None = None


async def _waits_on(engine: Engine, run: Run, viewer: str) -> bool:
    """Whether a call of ``run`` waits for ``viewer``'s decision now: the run's page then
    shows it to them."""
    undecided = run.undecided_calls() if run.state is RunState.SUSPENDED else ()
    if not undecided:
        return False
    return await engine.web.request_of_run(run.id, undecided[0].tool_call_id, viewer) is not None


async def _decided_in(engine: Engine, run: Run, viewer: str) -> bool:
    events = await engine.events(run.id)
    return any(e.kind in _DECISIONS and e.data.get("by") == viewer for e in events)


async def run_link(engine: Engine, run_id: str | None, viewer: str) -> RunLink | None:
    """The way back from a result page about ``run_id``, as ``viewer`` may see it; None
    when there is no such run or it is none of the viewer's concern."""
    if not run_id:
        return None
    try:
        run = (await engine.get_run(run_id)).run
    except (NotFound, InvalidInput):
        return None
    openable = run.user_id == viewer or await _waits_on(engine, run, viewer)
    if not openable and not await _decided_in(engine, run, viewer):
        return None
    root = run.root_run_id if run.is_child and run.user_id == viewer else None
    return RunLink(
        id=run.id, question=run.question, owner=run.user_id, openable=openable, root=root
    )


async def run_of_token(engine: Engine, token: str, viewer: str) -> str | None:
    """The run an approval token named, as ``viewer`` may see it now (pending, used, or
    expired for its owner); None when it names nothing they may see."""
    try:
        lookup = await engine.web.approval_request(token, viewer)
    except (UnknownOrExpired, InvalidInput):
        return None
    found = lookup.run or lookup.decided_run or lookup.expired
    return found.id if found is not None else None
