"""The messages a run starts with (reference §14): a new thread's first run stores its
system message and question when it is created; a follow-up writes its own once, as a
worker starts it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step.writes import error_content
from tether.messages import pending_tool_calls, tool_result
from tether.models.base import Message
from tether.runs import Run

if TYPE_CHECKING:
    from tether.agent import Agent

NOT_EXECUTED = (
    "not carried out: the run that asked for this call stopped before it had a result "
    "(its ledger tells what is known of it)"
)


async def open_follow_up(services: Services, run: Run, history: list[Message]) -> list[Message]:
    """Write a follow-up's first messages once, as it starts (reference §14): a
    ``not_executed`` result for each call its thread's conversation left without one, in
    the order of those calls, then its question. A run cancelled while queued never gets
    here, so it stays out of the conversation."""
    dangling = pending_tool_calls(history)
    opening = [tool_result(c.id, error_content("not_executed", NOT_EXECUTED)) for c in dangling]
    opening.append({"role": "user", "content": run.question})
    event = {"thread_id": run.thread_id, "not_executed": [c.id for c in dangling]}
    await hop(services.store.open_follow_up, run.lease(), messages=opening, event=event)
    return opening


def first_messages(agent: Agent, question: str, *, follow_up: bool) -> list[Message]:
    """What a new run stores now: a new thread's first run, the system message and its
    question; a follow-up nothing (its messages are written when it starts, once its
    thread's calls left without a result are answered)."""
    if follow_up:
        return []
    return [
        {"role": "system", "content": agent.instructions},
        {"role": "user", "content": question},
    ]
