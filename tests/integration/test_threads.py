"""Conversations (reference §14) through the Python API, on both backends: follow-ups see
the thread's conversation as stored, busy threads refuse or queue, queued runs start in
order and once, dangling calls get ``not_executed``, a thread is deleted whole, retention
purges a thread together, and nothing is copied per run.

No worker runs here: runs are carried with ``engine.run_until_stop``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import agents
import httpx
import pytest
import sqlalchemy as sa

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.errors import InvalidInput, NotFound, ThreadBusy
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.runs import RunState


class Recorder(Model):
    """Answers each question with ``answer to QUESTION`` and keeps every request."""

    name = "recorder"

    def __init__(self, calls: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.requests: list[list[Message]] = []
        # Questions whose first turn asks for these tool calls instead of answering.
        self.calls = calls or {}

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.requests.append([dict(m) for m in messages])
        last = messages[-1]
        if last.get("role") == "user" and str(last.get("content")) in self.calls:
            calls = self.calls[str(last["content"])]
            message: Message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                    }
                    for i, c in enumerate(calls)
                ],
            }
        else:
            question = next(
                str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"
            )
            message = {"role": "assistant", "content": f"answer to {question}"}
        return ModelResponse(
            message=message, usage=Usage(input_tokens=10, output_tokens=5), model="scripted"
        )


def build(url: str, model: Model, **settings: Any) -> Engine:
    return Engine(
        agent=agents.agent(),
        model=model,
        settings=Settings(database_url=url, **settings),
        notifier=MemoryNotifier(),
        migrate=True,
    )


async def test_a_follow_up_sees_the_whole_conversation_as_stored_then_its_question(
    db_url: str,
) -> None:
    model = Recorder()
    engine = build(db_url, model)
    try:
        first = await engine.start_run("dana", "q1")
        assert (await engine.run_until_stop(first.id)).kind is StopKind.ANSWERED
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id)
        assert second.thread_id == first.thread_id and second.state is RunState.RUNNING
        assert (await engine.run_until_stop(second.id)).answer == "answer to q2"
        stored_first = (await engine.get_run(first.id)).messages
        assert model.requests[-1] == [*stored_first, {"role": "user", "content": "q2"}]
        # Its own messages are its question onward; no system message is stored again.
        own = (await engine.get_run(second.id)).messages
        assert own == [
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "answer to q2"},
        ]
        thread = await engine.get_thread(first.thread_id, user="dana")
        assert thread.messages == [*stored_first, *own]
        assert [r.id for r in thread.runs] == [first.id, second.id]
        assert thread.consumed.steps == 2
        listed = await engine.list_threads("dana")
        assert [t.id for t in listed] == [first.thread_id]
    finally:
        await engine.aclose()


async def test_another_users_or_an_unknown_thread_is_not_found_and_creates_nothing(
    db_url: str,
) -> None:
    engine = build(db_url, Recorder())
    try:
        first = await engine.start_run("dana", "q1")
        for user, thread in (("miguel", first.thread_id), ("dana", "nope")):
            with pytest.raises(NotFound):
                await engine.start_run(user, "q2", thread_id=thread)
            with pytest.raises(NotFound):
                await engine.get_thread(thread, user=user)
            with pytest.raises(NotFound):
                await engine.delete_thread(thread, user=user)
        for bad in ("", "x" * 65, "a b", 7):
            with pytest.raises(InvalidInput):
                await engine.start_run("dana", "q", thread_id=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            await engine.start_run("dana", "q", thread_id=first.thread_id, if_busy="wait")
        assert [r.id for r in await engine.list_runs(None)] == [first.id]
    finally:
        await engine.aclose()


async def test_a_busy_thread_refuses_a_follow_up_or_queues_it_and_starts_it_after(
    db_url: str,
) -> None:
    engine = build(db_url, Recorder())
    try:
        first = await engine.start_run("dana", "q1")
        with pytest.raises(ThreadBusy) as refused:
            await engine.start_run("dana", "q2", thread_id=first.thread_id)
        assert refused.value.details["run_id"] == first.id
        queued = await engine.start_run("dana", "q2", thread_id=first.thread_id, if_busy="enqueue")
        assert queued.state is RunState.QUEUED
        # Not startable while the run before it is going.
        assert (await engine.run_until_stop(queued.id)).kind is StopKind.of(RunState.QUEUED)
        assert (await engine.get_run(queued.id)).run.state is RunState.QUEUED
        with pytest.raises(ThreadBusy):
            await engine.delete_thread(first.thread_id, user="dana")
        assert (await engine.run_until_stop(first.id)).kind is StopKind.ANSWERED
        assert (await engine.run_until_stop(queued.id)).answer == "answer to q2"
        await engine.delete_thread(first.thread_id, user="dana")
        assert list(await engine.list_runs(None)) == []
        with pytest.raises(NotFound):
            await engine.get_thread(first.thread_id, user="dana")
    finally:
        await engine.aclose()


async def test_a_run_cancelled_while_queued_stays_listed_but_out_of_the_conversation(
    db_url: str,
) -> None:
    model = Recorder()
    engine = build(db_url, model)
    try:
        first = await engine.start_run("dana", "q1")
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id, if_busy="enqueue")
        third = await engine.start_run("dana", "q3", thread_id=first.thread_id, if_busy="enqueue")
        assert (await engine.cancel_run(second.id, "dana")).state is RunState.CANCELLED
        await engine.run_until_stop(first.id)
        assert (await engine.run_until_stop(third.id)).answer == "answer to q3"
        thread = await engine.get_thread(first.thread_id, user="dana")
        assert [r.state for r in thread.runs] == [
            RunState.ANSWERED,
            RunState.CANCELLED,
            RunState.ANSWERED,
        ]
        assert not any(m.get("content") == "q2" for m in model.requests[-1])
    finally:
        await engine.aclose()


async def test_calls_a_stopped_run_left_without_a_result_get_not_executed_first(
    db_url: str,
) -> None:
    model = Recorder({"q1": [{"name": "send", "arguments": {"item": "b"}}]})
    engine = build(db_url, model)
    try:
        first = await engine.start_run("dana", "q1")
        assert (await engine.run_until_stop(first.id)).kind is StopKind.SUSPENDED
        await engine.cancel_run(first.id, "dana")  # the send is left without a result
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id)
        await engine.run_until_stop(second.id)
        own = (await engine.get_run(second.id)).messages
        assert own[0]["role"] == "tool" and own[0]["tool_call_id"] == "call_0"
        assert json.loads(own[0]["content"])["error"] == "not_executed"
        assert own[1] == {"role": "user", "content": "q2"}
        assert model.requests[-1][-2:] == own[:2]
    finally:
        await engine.aclose()


async def test_a_halted_run_cannot_go_on_once_its_thread_went_on_from_it(db_url: str) -> None:
    model = Recorder({"q1": [{"name": "lookup", "arguments": {"query": "x"}}]})
    engine = build(db_url, model)
    try:
        first = await engine.start_run("dana", "q1", limits={"max_steps": 1})
        assert (await engine.run_until_stop(first.id)).kind is StopKind.HALTED
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id)
        with pytest.raises(ThreadBusy) as refused:
            await engine.continue_run(first.id, "dana")
        assert refused.value.details["run_id"] == second.id
        assert (await engine.get_run(first.id)).run.state is RunState.HALTED
    finally:
        await engine.aclose()


async def test_concurrent_enqueued_follow_ups_all_run_one_at_a_time_in_order(db_url: str) -> None:
    engine = build(db_url, Recorder())
    try:
        first = await engine.start_run("dana", "q0")
        ids = await asyncio.gather(
            *(
                engine.start_run("dana", f"q{i}", thread_id=first.thread_id, if_busy="enqueue")
                for i in range(1, 21)
            )
        )
        assert all(r.state is RunState.QUEUED for r in ids)
        order = sorted(ids, key=lambda r: r.thread_pos)
        assert [r.thread_pos for r in order] == list(range(2, 22))
        await engine.run_until_stop(first.id)
        started = []
        while True:
            run = await engine.runner.claim()
            if run is None:
                break
            started.append(run.id)
            # Nothing else of the thread is claimable while this one is going.
            assert await engine.runner.claim() is None
            await engine.runner.carry(run)
        assert started == [r.id for r in order]
    finally:
        await engine.aclose()


async def test_a_follow_up_stores_only_its_own_messages(db_url: str) -> None:
    engine = build(db_url, Recorder())
    try:
        first = await engine.start_run("dana", "q1")
        await engine.run_until_stop(first.id)
        thread = first.thread_id
        for i in range(5):
            run = await engine.start_run("dana", f"follow {i}", thread_id=thread)
            await engine.run_until_stop(run.id)
        with engine.runner.store.engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT count(*) FROM run_messages")).scalar_one()
        assert stored == 3 + 5 * 2  # system, question, answer; then question, answer each
    finally:
        await engine.aclose()


async def test_a_follow_ups_statements_do_not_grow_with_its_thread(db_url: str) -> None:
    """Creating and starting a follow-up issues as many statements at place 3 as at place
    20, each of them as many times: the history is read in one statement, never per run
    or per message, and nothing of it is written again."""
    model = Recorder()
    engine = build(db_url, model)
    issued: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, params: Any, _context: Any, many: bool) -> None:
        # Each parameter set of an executemany counts as one statement of its own.
        issued.extend([sql] * (len(params) if many else 1))

    sa.event.listen(engine.runner.store.engine, "before_cursor_execute", record)
    try:
        first = await engine.start_run("dana", "q1")
        await engine.run_until_stop(first.id)
        counts: dict[int, dict[str, int]] = {}
        for place in range(2, 21):
            issued.clear()
            run = await engine.start_run("dana", f"follow {place}", thread_id=first.thread_id)
            assert (await engine.run_until_stop(run.id)).answer == f"answer to follow {place}"
            assert run.thread_pos == place
            counts[place] = {sql: issued.count(sql) for sql in issued}
        # The last one was handed the whole conversation: system, 19 runs of two, its question.
        assert len(model.requests[-1]) == 1 + 2 * 19 + 1
        assert model.requests[-1][-1] == {"role": "user", "content": "follow 20"}
        assert counts[20] == counts[3]
        assert sum(counts[20].values()) == sum(counts[3].values()) > 0
    finally:
        sa.event.remove(engine.runner.store.engine, "before_cursor_execute", record)
        await engine.aclose()


async def test_retention_purges_a_thread_only_when_its_latest_run_is_past_it(db_url: str) -> None:
    engine = build(db_url, Recorder())
    try:
        first = await engine.start_run("dana", "q1")
        await engine.run_until_stop(first.id)
        with engine.runner.store.begin() as conn:
            conn.execute(sa.text("UPDATE runs SET updated_at = updated_at - 1000"))
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id)
        await engine.run_until_stop(second.id)
        assert await asyncio.to_thread(engine.runner.store.purge_retained, 500.0, 10) == 0
        with engine.runner.store.begin() as conn:
            conn.execute(sa.text("UPDATE runs SET updated_at = updated_at - 1000"))
        assert await asyncio.to_thread(engine.runner.store.purge_retained, 500.0, 10) == 2
        assert await engine.list_threads("dana") == []
    finally:
        await engine.aclose()


# -- over HTTP -------------------------------------------------------------------------------


async def test_threads_over_http_shapes_refusals_and_deletion(db_url: str) -> None:
    engine = build(db_url, Recorder())
    await engine.operator.add_user("dana", "key-dana")
    await engine.operator.add_user("miguel", "key-miguel")
    dana = {"Authorization": "Bearer key-dana"}
    miguel = {"Authorization": "Bearer key-miguel"}
    transport = httpx.ASGITransport(app=create_app(engine))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            made = await client.post("/v1/runs", json={"question": "q1"}, headers=dana)
            assert made.status_code == 202 and set(made.json()) == {"id", "state"}
            first = made.json()["id"]
            thread = (await client.get(f"/v1/runs/{first}", headers=dana)).json()["thread_id"]
            follow = {"question": "q2", "thread_id": thread}
            busy = await client.post("/v1/runs", json=follow, headers=dana)
            assert busy.status_code == 409, busy.text
            assert busy.json() == {
                "ok": False,
                "error": "thread_busy",
                "message": busy.json()["message"],
                "run_id": first,
            }
            queued = await client.post(
                "/v1/runs", json={**follow, "if_busy": "enqueue"}, headers=dana
            )
            assert queued.status_code == 202 and queued.json()["state"] == "queued"
            for body in (
                {**follow, "if_busy": "later"},
                {**follow, "thread_id": "not a thread"},
                {**follow, "thread_id": 7},
            ):
                bad = await client.post("/v1/runs", json=body, headers=dana)
                assert bad.status_code == 422 and bad.json()["error"] == "invalid_input"
            other = await client.post("/v1/runs", json=follow, headers=miguel)
            assert other.status_code == 404 and other.json()["error"] == "not_found"
            for path in (f"/v1/threads/{thread}", "/v1/threads/nope"):
                assert (await client.get(path, headers=miguel)).status_code == 404
                assert (await client.delete(path, headers=miguel)).status_code == 404
            refused = await client.delete(f"/v1/threads/{thread}", headers=dana)
            assert refused.status_code == 409 and refused.json()["run_id"] == first
            await engine.run_until_stop(first)
            await engine.run_until_stop(queued.json()["id"])
            shown = (await client.get(f"/v1/threads/{thread}", headers=dana)).json()
            assert set(shown) == {
                "id",
                "user_id",
                "created_at",
                "updated_at",
                "runs",
                "messages",
                "consumed",
            }
            assert [r["question"] for r in shown["runs"]] == ["q1", "q2"]
            assert set(shown["runs"][0]) == {"id", "state", "question", "created_at"}
            assert shown["messages"][-1] == {"role": "assistant", "content": "answer to q2"}
            assert shown["consumed"]["steps"] == 2
            listed = (await client.get("/v1/threads", headers=dana)).json()["items"]
            assert [t["id"] for t in listed] == [thread] and "messages" not in listed[0]
            assert (await client.get("/v1/threads", headers=miguel)).json()["items"] == []
            gone = await client.delete(f"/v1/threads/{thread}", headers=dana)
            assert gone.status_code == 204
            assert (await client.get(f"/v1/runs/{first}", headers=dana)).status_code == 404
    finally:
        await engine.aclose()


async def test_threads_list_most_recently_active_first(db_url: str) -> None:
    engine = build(db_url, Recorder())
    try:
        older = await engine.start_run("dana", "a")
        newer = await engine.start_run("dana", "b")
        await engine.run_until_stop(newer.id)
        await engine.run_until_stop(older.id)  # the older thread is active last
        assert [t.id for t in await engine.list_threads("dana")] == [
            older.thread_id,
            newer.thread_id,
        ]
    finally:
        await engine.aclose()


async def test_a_fork_of_a_follow_up_starts_a_thread_holding_what_the_run_saw(
    db_url: str,
) -> None:
    model = Recorder({"q2": [{"name": "lookup", "arguments": {"query": "x"}}]})
    engine = build(db_url, model)
    try:
        first = await engine.start_run("dana", "q1")
        await engine.run_until_stop(first.id)
        second = await engine.start_run("dana", "q2", thread_id=first.thread_id)
        await engine.run_until_stop(second.id)
        fork = await engine.fork_run(second.id, "dana", at_step=1)
        assert fork.thread_id != first.thread_id
        parent_own = (await engine.get_run(second.id)).messages
        earlier = (await engine.get_run(first.id)).messages
        thread = await engine.get_thread(fork.thread_id, user="dana")
        # The parent thread up to the run, then the run's messages through step 1.
        assert thread.messages == [*earlier, *parent_own[:3]]
        assert (await engine.get_run(fork.id)).messages == parent_own[:3]
        # A fork of the fork counts the same steps.
        again = await engine.fork_run(fork.id, "dana", at_step=1)
        assert (await engine.get_thread(again.thread_id, user="dana")).messages == thread.messages
    finally:
        await engine.aclose()
