"""A run's final answer in its JSON (reference §6): ``"answer"`` is the text of the final
answer once the run is ``answered`` and null before, beside ``"output"``, wherever a run's
JSON is made (``GET /v1/runs/{id}``, ``GET /v1/runs``, ``RunView``, the runs the engine
lists), on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import agents
import pytest
from inbox_web import Web, web

from tether import StopKind
from tether.runs import RunState, run_to_json


@pytest.fixture
async def answering(db_url: str) -> AsyncIterator[Web]:
    w = await web(db_url, model=agents.script("standard"))
    yield w
    w.close()


async def test_an_answered_run_shows_its_answer_and_a_run_before_it_null(
    answering: Web,
) -> None:
    engine = answering.engine
    run_id, token = await answering.suspended("look things up then send b")
    waiting = await engine.get_run(run_id)
    assert waiting.answer is None and run_to_json(waiting.run)["answer"] is None
    await engine.resume_after_confirmation(token, "approve", "dana")
    assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED

    view = await engine.get_run(run_id)
    assert view.run.state is RunState.ANSWERED
    assert view.answer == "done" == view.messages[-1]["content"]
    shown = run_to_json(view.run)
    assert shown["answer"] == "done" and shown["output"] is None
    listed = {run.id: run for run in await engine.list_runs("dana")}
    assert listed[run_id].answer == "done"

    auth = {"Authorization": f"Bearer {answering.keys['dana']}"}
    async with answering.client() as client:
        one = await client.get(f"/v1/runs/{run_id}", headers=auth)
        every = await client.get("/v1/runs", headers=auth)
    assert one.status_code == 200 and one.json()["answer"] == "done"
    assert [(r["id"], r["answer"]) for r in every.json()["items"]] == [(run_id, "done")]


async def test_a_run_that_is_not_answered_has_a_null_answer_over_http(answering: Web) -> None:
    run_id, _ = await answering.suspended("send b")
    auth = {"Authorization": f"Bearer {answering.keys['dana']}"}
    async with answering.client() as client:
        one = await client.get(f"/v1/runs/{run_id}", headers=auth)
        every = await client.get("/v1/runs", headers=auth)
    assert one.json()["state"] == "suspended" and one.json()["answer"] is None
    assert every.json()["items"][0]["answer"] is None
