"""A follow-up's start (reference §14): the messages it writes once, as a worker starts it."""

from __future__ import annotations

from tether._runtime.hop import hop
from tether._runtime.services import Services
from tether._runtime.turns import error_content
from tether.messages import pending_tool_calls, tool_result
from tether.models.base import Message
from tether.runs import Run

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
