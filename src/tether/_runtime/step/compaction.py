"""Compaction (reference §14): what the model is handed when a conversation grew long.

The stored messages are never rewritten (invariant 1). A compaction is a stored summary of
the conversation's first ``through_seq`` messages, and the model is handed ``view``: the
system message, the summary as one user message, then every message after ``through_seq``.
The view is a function of what is stored (the conversation and its latest compaction, read
together when a run is taken up), so every owner hands the model the same messages.

When a model call reports more input tokens than the agent's ``max_input_tokens`` (stored
with its turn, ``runs.last_input_tokens``), the next model call is preceded by a compaction
that keeps the last ``keep_last_turns`` turns whole (``cut``) and summarises the rest: the
previous summary, if any, and the messages after it up to the cut.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tether._runtime.step import model_call
from tether._runtime.step.budget_check import budget_stop
from tether._runtime.step.model_failures import model_failed
from tether._runtime.step.model_rate import model_capacity, model_ended
from tether._runtime.step.session import RunSession
from tether.compaction import Compaction
from tether.errors import ModelError
from tether.failpoints import fail
from tether.messages import canonical_json, tool_calls_of
from tether.models.base import Message
from tether.models.pricing import spend_usd
from tether.results import Outcome
from tether.store import CompactionRecord
from tether.telemetry.metrics import MODEL_SECONDS

log = logging.getLogger(__name__)

SUMMARY_INSTRUCTION = (
    "Summarise the conversation below (one JSON message a line) for the assistant that "
    "will carry it on without seeing it: keep every fact, figure, identifier, decision, "
    "tool result and open request it may need later, and leave nothing out that a later "
    "answer could depend on. Answer with the summary only."
)


def summary_message(summary: str) -> Message:
    """How a summary reaches the model: one user message right after the system message."""
    return {"role": "user", "content": summary}


def view(conversation: Sequence[Message], compaction: CompactionRecord | None) -> list[Message]:
    """What the model is handed: the whole conversation, or with a compaction the system
    message, its summary, and the messages after the ones it covers. Pure: the same stored
    messages and compaction give the same view, in every process."""
    if compaction is None or not conversation:
        return list(conversation)
    kept = conversation[compaction.through_seq :]
    return [conversation[0], summary_message(compaction.summary), *kept]


def cut(conversation: Sequence[Message], keep_last_turns: int) -> int:
    """Where a compaction keeping the last ``keep_last_turns`` turns cuts ``conversation``:
    the index of its first kept message, which is the 1-based position of the last one
    it covers (its ``through_seq``). A turn is an assistant message with the results that
    answer it: everything from the ``keep_last_turns``-th most recent assistant message on
    is kept, with the user message just before it if there is one. 0 when there are fewer
    turns than that. The cut never falls between a call and its result."""
    turns = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
    if len(turns) < keep_last_turns:
        return 0
    first = turns[-keep_last_turns]
    if first > 0 and conversation[first - 1].get("role") == "user":
        first -= 1
    return _before_every_call_kept(conversation, first)


def _before_every_call_kept(conversation: Sequence[Message], first: int) -> int:
    """``first``, moved back to the turn of any call whose result it would keep without
    the call (stored conversations never need it; it makes the rule hold for any order)."""
    while True:
        asked = {
            call.id: i
            for i, m in enumerate(conversation[:first])
            if m.get("role") == "assistant"
            for call in tool_calls_of(m)
        }
        split = [
            asked[m["tool_call_id"]]
            for m in conversation[first:]
            if m.get("role") == "tool" and m.get("tool_call_id") in asked
        ]
        if not split:
            return first
        first = min(split)


def to_summarise(
    conversation: Sequence[Message], compaction: CompactionRecord | None, through: int
) -> list[Message]:
    """What a new compaction through ``through`` summarises: the previous summary (as the
    model saw it) and the messages after it up to the cut; or, for the first, every
    message after the system message up to the cut. Copies: a summariser cannot change
    the stored messages."""
    start = 1 if compaction is None else compaction.through_seq
    previous = [] if compaction is None else [summary_message(compaction.summary)]
    return [*previous, *(dict(m) for m in conversation[start:through])]


def summary_request(messages: Sequence[Message]) -> list[Message]:
    """The request that asks the agent's model for a summary of ``messages`` (no tools)."""
    transcript = "\n".join(canonical_json(m) for m in messages)
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTION},
        {"role": "user", "content": transcript},
    ]


async def compact_if_due(session: RunSession, failures: int) -> Outcome | None:
    """Before a model call: when the latest call reported more input tokens than the
    agent's threshold and the cut moved past the previous compaction, check the budget,
    summarise, and store the compaction (one fenced write with its spend and its
    ``compacted`` event). Returns the run's stop when the budget halts it or the
    summariser's model failed (handed back with a delay, or failed, as any model call:
    ``model_failures.py``); None to go on to the model call.

    Safe to run twice: until the compaction is stored, the trigger stays stored with the
    turn that set it, so the next owner compacts the same messages again; once it is
    stored, the trigger is spent in the same transaction and the next owner hands the
    model the compacted view."""
    config = session.services.agent.compaction
    if config is None or session.input_tokens <= config.max_input_tokens:
        return None
    conversation = session.conversation()
    through = cut(conversation, config.keep_last_turns)
    if through <= (1 if session.compaction is None else session.compaction.through_seq):
        return None  # nothing new to summarise: the view stays as it is
    stop = await budget_stop(session, "model")
    if stop is not None:
        return stop
    session.check_held()
    covered = to_summarise(conversation, session.compaction, through)
    if config.summarize is None and not await model_capacity(session):
        return await session.release("worker stopping")
    try:
        summary, tokens, spend = await _summarise(session, config, covered)
    except ModelError as exc:
        return await model_failed(session, exc, failures)
    await session.compact(summary, through_seq=through, tokens=tokens, spend=spend)
    log.info(
        "compacted",
        extra={"run_id": session.run.id, "action": "compacted", "through_seq": through},
    )
    fail("after_compaction")
    return None


async def _summarise(
    session: RunSession, config: Compaction, covered: list[Message]
) -> tuple[str, int, float]:
    """The summary of ``covered``, its output tokens and its spend: by the agent's
    ``summarize`` (a plain function runs in a thread, as a plain tool does; no tokens, no
    spend) or by its model."""
    if config.summarize is not None:
        fn: Callable[[list[Message]], Any] = config.summarize
        made = (
            fn(covered) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, covered)
        )
        if inspect.isawaitable(made):
            made = await made
        if not isinstance(made, str):
            raise TypeError(f"compaction: summarize returned {type(made).__name__}, not str")
        return made, 0, 0.0
    with MODEL_SECONDS.time():
        answered = await model_call.ask(session, summary_request(covered), [], streamed=False)
    response = answered.response
    model_ended(session, response.usage)
    text = response.message.get("content")
    if not isinstance(text, str) or not text.strip():
        raise ModelError("the model gave no summary to compact the conversation with")
    prices = session.services.settings.prices
    spend = spend_usd(response.model, response.usage, prices, entry=answered.entry.spec)
    return text, response.usage.output_tokens, spend
