"""A run's thread on its page (reference §14): the thread's runs in order with their state and
question, the current one marked and the others linked; and the follow-up box that an
answered run offers when it is the latest of its thread and the thread is not busy. The
page is its owner's only, and so is every run it links to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.engine import Engine
from tether.errors import NotFound
from tether.runs import BUSY, Run, RunState


@dataclass(frozen=True, kw_only=True)
class FollowUp:
    """The follow-up box as shown: what was typed, whether to queue it behind a busy
    thread, and why the last one was refused."""

    question: str = ""
    enqueue: bool = False
    error: str | None = None
    # After a busy thread's refusal: the run it waits on.
    waits_on: str | None = None


@dataclass(frozen=True, kw_only=True)
class ThreadPanel:
    """The thread of the run a page shows: its runs in order, which one is shown, and the
    follow-up box (None when the run offers none)."""

    id: str
    runs: tuple[Run, ...]
    current: str
    follow_up: FollowUp | None


def offers_follow_up(run: Run, runs: tuple[Run, ...]) -> bool:
    """Whether ``run``'s page offers a follow-up: it answered, it is the latest of its
    thread, and no run of the thread is busy."""
    return (
        run.state is RunState.ANSWERED
        and bool(runs)
        and runs[-1].id == run.id
        and not any(r.state in BUSY for r in runs)
    )


async def thread_panel(
    engine: Engine, run: Run, viewer: str, *, refused: FollowUp | None = None
) -> ThreadPanel | None:
    """The panel of ``run``'s thread for its owner ``viewer``; after a refused follow-up,
    the box again with what was typed and why (whatever the thread's state now). None if
    the thread is gone meanwhile."""
    try:
        thread = await engine.get_thread(run.thread_id, user=viewer)
    except NotFound:
        return None
    runs = tuple(thread.runs)
    box = refused
    if box is None and offers_follow_up(run, runs):
        box = FollowUp()
    return ThreadPanel(id=thread.id, runs=runs, current=run.id, follow_up=box)


def read_follow_up(form: Mapping[str, Any]) -> FollowUp:
    """The posted question (line breaks as typed, ends trimmed; the engine checks it) and
    whether a busy thread should queue it."""
    raw = form.get("question")
    text = raw.replace("\r\n", "\n").strip() if isinstance(raw, str) else ""
    return FollowUp(question=text, enqueue=form.get("if_busy") == "enqueue")
