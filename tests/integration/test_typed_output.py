"""Typed output (reference §11) on both backends: a final answer validated against the agent's
``output_type``, shown as ``output`` in the run's JSON (HTTP, CLI, engine) and on
``ask()``; an invalid answer sent back to the model with its errors in one write, a step
like any other; a model that never answers validly halting on its budget; the real OpenAI
adapter; and the example of docs/integrations.md, run as written. Declaration errors and
checking an answer without a run are tests/unit/test_output.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agents
import httpx
import inprocess
import processes
import pytest
import sqlalchemy as sa
from fakellm import OPENAI_PATH, Reply, openai_completion, running
from quotes import INVALID, VALID, Quote

from tether import Agent, Engine, MemoryNotifier, ScriptedModel, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.models.base import Message, Model, ModelResponse, ToolSpec
from tether.models.openai import OpenAIChatModel

DANA_KEY = "key-of-dana"
DANA = {"Authorization": f"Bearer {DANA_KEY}"}
PROMPT = "You price quotes."


def typed_agent() -> Agent:
    return Agent(
        name="typed",
        system_prompt=PROMPT,
        tools=(agents.lookup,),
        resolve_scope=agents.resolve,
        output_type=Quote,
    )


class Recording(Model):
    """A scripted model that keeps a copy of every message list it was sent."""

    def __init__(self, turns: list[dict[str, Any]], *, final: str = "still no JSON") -> None:
        self.inner = ScriptedModel(turns, final=final)
        self.seen: list[list[Message]] = []

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.seen.append(copy.deepcopy(messages))
        return await self.inner.request(messages, tools)


def typed_engine(url: str, model: Model) -> Engine:
    return Engine(
        agent=typed_agent(),
        model=model,
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )


def stored_output_is_null(url: str, run_id: str) -> bool:
    """Whether ``runs.output`` is SQL NULL (not a JSON ``null``) for the run."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            query = sa.text("SELECT output IS NULL FROM runs WHERE id = :id")
            return bool(conn.execute(query, {"id": run_id}).scalar_one())
    finally:
        engine.dispose()


@dataclass
class Api:
    engine: Engine
    client: httpx.AsyncClient


@asynccontextmanager
async def serving(url: str, model: Model) -> AsyncIterator[Api]:
    engine = typed_engine(url, model)
    await engine.operator.add_user("dana", DANA_KEY)
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            yield Api(engine=engine, client=c)
    finally:
        engine.close()


# -- a valid answer ------------------------------------------------------------------------


async def test_a_valid_answer_is_the_output_over_http_on_the_engine_and_in_the_list(
    db_url: str,
) -> None:
    model = Recording(
        [
            {"tool_calls": [agents.call("lookup", query="Henderson")]},
            {"content": json.dumps(VALID)},
        ]
    )
    async with serving(db_url, model) as api:
        response = await api.client.post("/v1/runs", json={"question": "quote"}, headers=DANA)
        assert response.status_code == 202, response.text
        run_id = response.json()["id"]
        outcome = await api.engine.run_until_stop(run_id)
        body = (await api.client.get(f"/v1/runs/{run_id}", headers=DANA)).json()
        listed = (await api.client.get("/v1/runs", headers=DANA)).json()["items"]
        view = await api.engine.get_run(run_id)
        events = [e.kind for e in await api.engine.events(run_id)]

    assert outcome.kind is StopKind.ANSWERED
    assert isinstance(outcome.output, Quote)
    assert outcome.output == Quote.model_validate(VALID)
    assert outcome.answer == json.dumps(VALID)
    assert body["state"] == "answered" and body["output"] == VALID
    assert [item["output"] for item in listed] == [VALID]
    assert view.output == VALID and view.run.output == VALID
    assert "output_invalid" not in events
    # The model was told the shape in the system message, from the first request on.
    system = model.seen[0][0]
    assert system["role"] == "system"
    assert system["content"].startswith(PROMPT + "\n\n")
    assert json.dumps(Quote.model_json_schema(), sort_keys=True) in system["content"]


async def test_ask_returns_the_validated_instance_and_a_fenced_block_is_accepted(
    db_url: str,
) -> None:
    fenced = f"Here is the quote:\n```json\n{json.dumps(VALID, indent=2)}\n```\nThanks!"
    engine = typed_engine(db_url, ScriptedModel([{"content": fenced}]))
    try:
        outcome = await engine.ask("dana", "quote")
        view = await engine.get_run(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    assert isinstance(outcome.output, Quote) and outcome.output.lines[0].quantity == 200
    assert view.output == VALID
    assert view.run.budget.steps == 1


async def test_runs_show_prints_the_output(db_url: str) -> None:
    engine = typed_engine(db_url, ScriptedModel([{"content": json.dumps(VALID)}]))
    try:
        outcome = await engine.ask("dana", "quote")
    finally:
        engine.close()
    shown = processes.tether("runs", "show", outcome.run_id, env=processes.tether_env(db_url))
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    assert body["state"] == "answered" and body["output"] == VALID


async def test_an_agent_without_output_type_keeps_its_prompt_and_stores_null(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    try:
        outcome = await engine.ask("dana", "what is it?")
        view = await engine.get_run(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.ANSWERED
    assert outcome.answer == "forty-two" and outcome.output is None
    assert view.messages[0] == {"role": "system", "content": "You are a test agent."}
    assert view.output is None
    assert stored_output_is_null(db_url, outcome.run_id)


# -- an invalid answer ---------------------------------------------------------------------


async def test_an_invalid_answer_goes_back_with_its_errors_in_one_write_then_validates(
    db_url: str,
) -> None:
    model = Recording([{"content": json.dumps(INVALID)}, {"content": json.dumps(VALID)}])
    engine = typed_engine(db_url, model)
    turn_writes = inprocess.count_calls(engine, "persist_turn")
    try:
        outcome = await engine.ask("dana", "quote")
        view = await engine.get_run(outcome.run_id)
        events = await engine.events(outcome.run_id)
    finally:
        engine.close()

    assert outcome.kind is StopKind.ANSWERED and outcome.output == Quote.model_validate(VALID)
    assert len(model.seen) == 2
    feedback = model.seen[1][-1]
    assert feedback["role"] == "user"
    lines = feedback["content"].splitlines()
    assert "- lines.0.quantity: Input should be greater than 0" in lines
    assert "- total: Field required" in lines
    assert model.seen[1][-2] == {"role": "assistant", "content": json.dumps(INVALID)}
    # Two steps consumed, both spent; the rejected answer and its feedback in one write.
    assert view.run.budget.steps == 2
    spent = [e.data["spend_usd"] for e in events if e.kind == "model_turn"]
    assert len(spent) == 2 and all(s > 0 for s in spent)
    assert view.run.budget.spend_usd == pytest.approx(sum(spent))
    assert [len(w["results"]) for w in turn_writes] == [1, 0]
    assert [w["final"] for w in turn_writes] == [False, True]
    assert view.messages[2:] == [*model.seen[1][2:], view.messages[-1]]
    invalid = [e for e in events if e.kind == "output_invalid"]
    assert len(invalid) == 1 and invalid[0].data["step"] == 1
    assert invalid[0].data["count"] == 2
    assert {e["loc"] for e in invalid[0].data["errors"]} == {"lines.0.quantity", "total"}
    assert [e.kind for e in events][-1] == "answered"


async def test_a_model_that_never_answers_validly_halts_on_max_steps_with_null_output(
    db_url: str,
) -> None:
    model = Recording([], final="I would rather explain it in prose.")
    engine = typed_engine(db_url, model)
    try:
        outcome = await engine.ask("dana", "quote", limits={"max_steps": 3})
        view = await engine.get_run(outcome.run_id)
        events = await engine.events(outcome.run_id)
    finally:
        engine.close()
    assert outcome.kind is StopKind.HALTED and outcome.reason == "max_steps"
    assert outcome.output is None and view.output is None
    assert stored_output_is_null(db_url, outcome.run_id)
    assert view.run.budget.steps == 3 and len(model.seen) == 3
    roles = [m["role"] for m in view.messages]
    assert roles == ["system", "user", *["assistant", "user"] * 3]
    assert [e.kind for e in events].count("output_invalid") == 3


async def test_the_feedback_is_durable_a_continued_run_sends_it_to_the_model(
    db_url: str,
) -> None:
    first = typed_engine(db_url, ScriptedModel([{"content": "about 950 dollars"}]))
    try:
        halted = await first.ask("dana", "quote", limits={"max_steps": 1})
    finally:
        first.close()
    assert halted.kind is StopKind.HALTED and halted.reason == "max_steps"

    model = Recording([{"content": "unused"}, {"content": json.dumps(VALID)}])
    second = typed_engine(db_url, model)  # another engine: only what was stored carries on
    try:
        await second.continue_run(halted.run_id, "dana")
        outcome = await second.run_until_stop(halted.run_id)
        view = await second.get_run(halted.run_id)
    finally:
        second.close()
    assert outcome.kind is StopKind.ANSWERED and isinstance(outcome.output, Quote)
    assert model.seen[0][-1]["role"] == "user"
    assert "- (root): Invalid JSON" in model.seen[0][-1]["content"]
    assert view.output == VALID and view.run.budget.steps == 2


async def test_the_openai_adapter_sends_the_schema_and_the_errors(db_url: str) -> None:
    with running(OPENAI_PATH) as server:
        server.script(
            Reply(body=openai_completion(content=json.dumps(INVALID))),
            Reply(body=openai_completion(content=json.dumps(VALID))),
        )
        gpt = OpenAIChatModel(
            "gpt-4o-mini", base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0
        )
        engine = typed_engine(db_url, gpt)
        try:
            outcome = await engine.ask("dana", "quote")
        finally:
            await engine.aclose()
        sent = [r.body["messages"] for r in server.requests]
    assert outcome.kind is StopKind.ANSWERED and outcome.output == Quote.model_validate(VALID)
    assert len(sent) == 2
    assert '"title": "Quote"' in sent[0][0]["content"]
    assert sent[1][-1]["role"] == "user"
    assert "- total: Field required" in sent[1][-1]["content"]


# -- the documented example ----------------------------------------------------------------


def test_the_integrations_page_example_runs_as_written(tmp_path: Path) -> None:
    page = (processes.ROOT / "docs" / "integrations.md").read_text()
    section = page.split("## Typed output", 1)[1]
    code = re.search(r"```python\n(.*?\n)```\n", section, re.DOTALL)
    printed = re.search(r"```text\n(.*?\n)```\n", section, re.DOTALL)
    assert code is not None and printed is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    done = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed.group(1)
    assert (tmp_path / "typed.db").exists()
