"""A run's lineage on its page (reference §12): the run it was forked from, the runs forked from
it, and the form that forks it from a step. The page is its owner's only, and so is every
run it links to."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether.engine import Engine
from tether.errors import InvalidInput, NotFound
from tether.messages import step_boundary
from tether.models.base import Message
from tether.runs import Run, RunState

# The states whose runs the page offers to fork: how a person debugs a run that stopped.
FORKABLE = (RunState.HALTED, RunState.FAILED)
_STEP = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True, kw_only=True)
class Parent:
    """The run this one was forked from, and the step; ``linked`` when the viewer may open
    its page (it is theirs and still kept)."""

    run_id: str
    step: int
    linked: bool


@dataclass(frozen=True, kw_only=True)
class ForkForm:
    """The "fork from step K" form as shown: its values, and why the last one was refused."""

    at_step: str
    max_step: int
    dry_run: bool = False
    error: str | None = None


async def lineage(engine: Engine, run: Run, viewer: str) -> dict[str, Any]:
    """The page's ``parent`` (or None) and ``forks`` (oldest first), only the viewer's."""
    parent = None
    if run.forked_from is not None:
        parent_id = str(run.forked_from["run_id"])
        try:
            linked = bool(await engine.get_run(parent_id, user=viewer))
        except NotFound:  # not the viewer's, or purged
            linked = False
        parent = Parent(run_id=parent_id, step=int(run.forked_from["step"]), linked=linked)
    forks = [fork for fork in await engine.forks_of(run.id) if fork.user_id == viewer]
    return {"parent": parent, "forks": forks}


def fork_form(run: Run, messages: Sequence[Message]) -> ForkForm | None:
    """The form for a halted or failed run, pre-filled with its step, or with the latest
    step before it whose calls all have results when it stopped inside a step (a budget
    halt between two calls of a turn); None when no step can be forked."""
    if run.state not in FORKABLE:
        return None
    for step in range(run.step, 0, -1):
        try:
            step_boundary(messages, step)
        except InvalidInput:
            continue
        return ForkForm(at_step=str(step), max_step=run.step)
    return None


def read_fork(form: Mapping[str, Any]) -> tuple[int, bool]:
    """The posted ``at_step`` and whether the dry-run box was ticked; ``InvalidInput``
    when the step is not a whole number (the engine checks its range)."""
    raw = form.get("at_step")
    text = raw.strip() if isinstance(raw, str) else ""
    if not _STEP.fullmatch(text):
        raise InvalidInput("the step to fork from must be a whole number from 1")
    return int(text), form.get("dry_run") is not None


def refused(run: Run, form: Mapping[str, Any], error: str) -> ForkForm:
    """The form again, with what was posted and why the fork was refused."""
    raw = form.get("at_step")
    return ForkForm(
        at_step=raw if isinstance(raw, str) else "",
        max_step=max(run.step, 1),
        dry_run=form.get("dry_run") is not None,
        error=error,
    )
