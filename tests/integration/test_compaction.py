"""Compaction (reference §14) through the Python API, on both backends: after a model call
reports more input tokens than the threshold, the next call sees the system message, one
summary and the last turns; the summary's spend is counted and its call is not a step; a
``compacted`` event is stored; a second compaction summarises the first; a thread's
follow-ups see the compacted view; ``summarize`` may be sync or async; the budget is
checked before summarising; a summariser that is down is a model failure; and the stored
messages are never rewritten.

No worker runs here: runs are carried with ``engine.run_until_stop``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from waiting import until

from tether import Agent, Compaction, Engine, MemoryNotifier, StopKind, tool
from tether._runtime.step.compaction import SUMMARY_INSTRUCTION
from tether.config import Settings
from tether.errors import ModelError
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.models.pricing import spend_usd
from tether.runs import RunState

BIG = 5000  # input tokens over the threshold
SMALL = 50
SUMMARY_OUT = 7


@tool
def lookup(query: str) -> dict[str, Any]:
    """Look something up (a read)."""
    return {"answer": f"about {query}"}


def call(call_id: str, query: str) -> Message:
    arguments = json.dumps({"query": query})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup", "arguments": arguments},
            }
        ],
    }


def answer(text: str) -> Message:
    return {"role": "assistant", "content": text}


class Recorder(Model):
    """Plays scripted turns (each with the input tokens it reports) and answers a request
    for a summary with ``summary N``; keeps every request of each kind."""

    name = "recorder"

    def __init__(self, turns: list[tuple[Message, int]], *, summary_fails: int = 0) -> None:
        self.turns = list(turns)
        self.requests: list[list[Message]] = []
        self.summaries: list[list[Message]] = []
        self.summary_fails = summary_fails

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        if not tools and messages[0].get("content") == SUMMARY_INSTRUCTION:
            if self.summary_fails:
                self.summary_fails -= 1
                raise ModelError("the summariser is down", status=503, transient=True)
            self.summaries.append([dict(m) for m in messages])
            return ModelResponse(
                message=answer(f"summary {len(self.summaries)}"),
                usage=Usage(input_tokens=300, output_tokens=SUMMARY_OUT),
                model="scripted",
            )
        self.requests.append([dict(m) for m in messages])
        message, tokens = self.turns.pop(0)
        return ModelResponse(
            message=message, usage=Usage(input_tokens=tokens, output_tokens=5), model="scripted"
        )


def build(url: str, model: Model, compaction: Compaction, **settings: Any) -> Engine:
    agent = Agent(name="compacting", system_prompt="sys", tools=(lookup,), compaction=compaction)
    return Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=url, **settings),
        notifier=MemoryNotifier(),
        migrate=True,
    )


def summary(text: str) -> Message:
    return {"role": "user", "content": text}


def spent(model_tokens: list[int], summaries: int = 0) -> float:
    prices = Settings().prices
    turns = sum(
        spend_usd("scripted", Usage(input_tokens=t, output_tokens=5), prices) for t in model_tokens
    )
    one = spend_usd("scripted", Usage(input_tokens=300, output_tokens=SUMMARY_OUT), prices)
    return turns + summaries * one


async def compacted_events(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    return [e.data for e in await engine.events(run_id) if e.kind == "compacted"]


async def test_after_the_threshold_the_next_call_sees_the_system_message_a_summary_and_one_turn(
    db_url: str,
) -> None:
    model = Recorder([(call("c1", "a"), SMALL), (call("c2", "b"), BIG), (answer("done"), SMALL)])
    engine = build(db_url, model, Compaction(max_input_tokens=1000, keep_last_turns=1))
    try:
        run = await engine.start_run("dana", "q")
        assert (await engine.run_until_stop(run.id)).answer == "done"
        stored = (await engine.get_run(run.id)).messages
        sys, q, a1, r1, a2, r2, _a3 = stored
        # The first two calls saw everything; the third the summary and the last turn.
        assert model.requests[0] == [sys, q]
        assert model.requests[1] == [sys, q, a1, r1]
        assert model.requests[2] == [sys, summary("summary 1"), a2, r2]
        # The summariser was handed what it covers: the question and the first turn.
        transcript = model.summaries[0][1]["content"].splitlines()
        assert [json.loads(line) for line in transcript] == [q, a1, r1]
        # Nothing stored was rewritten or summarised away.
        assert [m["role"] for m in stored] == [
            "system", "user", "assistant", "tool", "assistant", "tool", "assistant"
        ]  # fmt: skip
        thread = await engine.get_thread(run.thread_id, user="dana")
        assert thread.messages == stored
        # Three model turns are three steps; the summary's spend is counted too.
        view = (await engine.get_run(run.id)).run
        assert view.step == 3 and view.budget.steps == 3
        assert view.budget.spend_usd == pytest.approx(spent([SMALL, BIG, SMALL], summaries=1))
        assert await compacted_events(engine, run.id) == [
            {
                "through_seq": 4,
                "summary_tokens": SUMMARY_OUT,
                "spend_usd": pytest.approx(spent([], 1)),
            }
        ]
    finally:
        await engine.aclose()


async def test_a_second_compaction_summarises_the_previous_summary_and_what_came_after_it(
    db_url: str,
) -> None:
    model = Recorder(
        [
            (call("c1", "a"), SMALL),
            (call("c2", "b"), BIG),
            (call("c3", "c"), BIG),
            (answer("done"), SMALL),
        ]
    )
    engine = build(db_url, model, Compaction(max_input_tokens=1000, keep_last_turns=1))
    try:
        run = await engine.start_run("dana", "q")
        assert (await engine.run_until_stop(run.id)).answer == "done"
        sys, _q, _a1, _r1, a2, r2, a3, r3, _a4 = (await engine.get_run(run.id)).messages
        assert model.requests[2] == [sys, summary("summary 1"), a2, r2]
        assert model.requests[3] == [sys, summary("summary 2"), a3, r3]
        transcript = [json.loads(line) for line in model.summaries[1][1]["content"].splitlines()]
        assert transcript == [summary("summary 1"), a2, r2]
        events = await compacted_events(engine, run.id)
        assert [e["through_seq"] for e in events] == [4, 6]
        assert (await engine.get_run(run.id)).run.budget.steps == 4
    finally:
        await engine.aclose()


async def test_a_compaction_lasts_while_calls_stay_under_the_threshold_and_keeps_k_turns(
    db_url: str,
) -> None:
    model = Recorder(
        [
            (call("c1", "a"), SMALL),
            (call("c2", "b"), SMALL),
            (call("c3", "c"), BIG),
            (call("c4", "d"), SMALL),
            (answer("done"), SMALL),
        ]
    )
    engine = build(db_url, model, Compaction(max_input_tokens=1000, keep_last_turns=2))
    try:
        run = await engine.start_run("dana", "q")
        assert (await engine.run_until_stop(run.id)).answer == "done"
        sys, _q, _a1, _r1, a2, r2, a3, r3, a4, r4, _a5 = (await engine.get_run(run.id)).messages
        assert model.requests[3] == [sys, summary("summary 1"), a2, r2, a3, r3]
        assert model.requests[4] == [sys, summary("summary 1"), a2, r2, a3, r3, a4, r4]
        assert len(model.summaries) == 1
    finally:
        await engine.aclose()


async def test_a_follow_up_starts_with_its_threads_compaction_and_compacts_across_runs(
    db_url: str,
) -> None:
    model = Recorder(
        [
            (call("c1", "a"), SMALL),
            (answer("first"), BIG),  # over the threshold: the next call, in the follow-up
            (answer("second"), SMALL),
            (answer("third"), SMALL),
        ]
    )
    engine = build(db_url, model, Compaction(max_input_tokens=1000, keep_last_turns=1))
    try:
        first = await engine.start_run("dana", "q1")
        assert (await engine.run_until_stop(first.id)).answer == "first"
        assert model.summaries == []
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id)
        assert (await engine.run_until_stop(second.id)).answer == "second"
        sys, _q1, _a1, _r1, a2 = (await engine.get_run(first.id)).messages
        q2 = {"role": "user", "content": "q2"}
        assert model.requests[2] == [sys, summary("summary 1"), a2, q2]
        # The compaction is the follow-up's: its spend, its event; not the first run's.
        assert await compacted_events(engine, second.id) == [
            {
                "through_seq": 4,
                "summary_tokens": SUMMARY_OUT,
                "spend_usd": pytest.approx(spent([], 1)),
            }
        ]
        assert await compacted_events(engine, first.id) == []
        view = (await engine.get_run(second.id)).run
        assert view.budget.steps == 1
        assert view.budget.spend_usd == pytest.approx(spent([SMALL], summaries=1))
        # A third run of the thread sees the thread's compaction too (and no new one).
        third = await engine.start_run("dana", "q3", thread_id=first.thread_id)
        assert (await engine.run_until_stop(third.id)).answer == "third"
        a_second = answer("second")
        q3 = {"role": "user", "content": "q3"}
        assert model.requests[3] == [sys, summary("summary 1"), a2, q2, a_second, q3]
        assert len(model.summaries) == 1
        thread = await engine.get_thread(first.thread_id, user="dana")
        assert thread.messages is not None
        assert len(thread.messages) == 9  # whole: 5 + 2 + 2, nothing summarised away
    finally:
        await engine.aclose()


def _sync_summary(seen: list[list[dict[str, Any]]]) -> Any:
    def summarize(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return f"my summary of {len(messages)}"

    return summarize


def _async_summary(seen: list[list[dict[str, Any]]]) -> Any:
    async def summarize(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return f"my summary of {len(messages)}"

    return summarize


@pytest.mark.parametrize("kind", [_sync_summary, _async_summary], ids=["sync", "async"])
async def test_a_summarize_function_writes_the_summary_with_no_tokens_and_no_spend(
    db_url: str, kind: Any
) -> None:
    seen: list[list[dict[str, Any]]] = []
    model = Recorder([(call("c1", "a"), SMALL), (call("c2", "b"), BIG), (answer("done"), SMALL)])
    compaction = Compaction(max_input_tokens=1000, keep_last_turns=1, summarize=kind(seen))
    engine = build(db_url, model, compaction)
    try:
        run = await engine.start_run("dana", "q")
        assert (await engine.run_until_stop(run.id)).answer == "done"
        sys, q, a1, r1, a2, r2, _a3 = (await engine.get_run(run.id)).messages
        assert seen == [[q, a1, r1]]
        assert model.summaries == []  # the model was not asked
        assert model.requests[2] == [sys, summary("my summary of 3"), a2, r2]
        assert await compacted_events(engine, run.id) == [
            {"through_seq": 4, "summary_tokens": 0, "spend_usd": 0.0}
        ]
        assert (await engine.get_run(run.id)).run.budget.spend_usd == pytest.approx(
            spent([SMALL, BIG, SMALL])
        )
    finally:
        await engine.aclose()


async def test_the_budget_is_checked_before_summarising_and_the_compaction_waits_for_the_grant(
    db_url: str,
) -> None:
    model = Recorder([(call("c1", "a"), SMALL), (call("c2", "b"), BIG), (answer("done"), SMALL)])
    engine = build(db_url, model, Compaction(max_input_tokens=1000, keep_last_turns=1))
    try:
        limit = spent([SMALL, BIG]) * 0.99  # spent by the two turns: no summary may follow
        run = await engine.start_run("dana", "q", limits={"max_spend_usd": limit})
        outcome = await engine.run_until_stop(run.id)
        assert outcome.kind is StopKind.HALTED and outcome.reason == "max_spend"
        assert model.summaries == [] and len(model.requests) == 2
        await engine.continue_run(run.id, "dana", limits={"max_spend_usd": 1.0})
        assert (await engine.run_until_stop(run.id)).answer == "done"
        sys, _q, _a1, _r1, a2, r2, _a3 = (await engine.get_run(run.id)).messages
        assert model.requests[2] == [sys, summary("summary 1"), a2, r2]
    finally:
        await engine.aclose()


async def test_a_summariser_that_is_down_is_a_model_failure_and_the_compaction_is_retried(
    db_url: str,
) -> None:
    model = Recorder(
        [(call("c1", "a"), SMALL), (call("c2", "b"), BIG), (answer("done"), SMALL)],
        summary_fails=1,
    )
    engine = build(
        db_url,
        model,
        Compaction(max_input_tokens=1000, keep_last_turns=1),
        model_retry_first_s=0.01,
        model_retry_max_s=0.01,
    )
    try:
        run = await engine.start_run("dana", "q")
        outcome = await engine.run_until_stop(run.id)
        assert outcome.kind is StopKind.RELEASED and outcome.reason == "model_retry"
        stopped = (await engine.get_run(run.id)).run
        assert stopped.state is RunState.RUNNING and stopped.model_failures == 1
        assert await compacted_events(engine, run.id) == []
        # Claimed again once its delay passed: the compaction is made, then the call.

        async def carried() -> str | None:
            return (await engine.run_until_stop(run.id)).answer

        assert await until(carried, what="the run answered after its backoff") == "done"
        sys, _q, _a1, _r1, a2, r2, _a3 = (await engine.get_run(run.id)).messages
        assert model.requests[2] == [sys, summary("summary 1"), a2, r2]
        assert len(await compacted_events(engine, run.id)) == 1
    finally:
        await engine.aclose()


async def test_without_compaction_or_under_the_threshold_the_model_sees_everything(
    db_url: str,
) -> None:
    model = Recorder([(call("c1", "a"), SMALL), (call("c2", "b"), SMALL), (answer("done"), 1000)])
    engine = build(db_url, model, Compaction(max_input_tokens=1000, keep_last_turns=1))
    try:
        run = await engine.start_run("dana", "q")
        assert (await engine.run_until_stop(run.id)).answer == "done"
        assert model.requests[2] == (await engine.get_run(run.id)).messages[:-1]
        assert model.summaries == []
    finally:
        await engine.aclose()
