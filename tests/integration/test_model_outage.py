"""A model that is down (reference §10), on both backends, through the real ``openai:`` and
``anthropic:`` adapters talking HTTP to local fake servers made to fail.

A transient failure hands the run back, unowned, with a delay and a ``model_retry`` event;
the next claim asks again from the stored messages. Consecutive failures up to
``max_model_attempts`` fail it ``model_unavailable``; a permanent error fails it
``model_error`` at once. Backoffs here are tens of milliseconds (``model_retry_first_s``)
and every wait polls with a deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import agents
import httpx
import pytest
import sqlalchemy as sa
from fakellm import (
    ANTHROPIC_PATH,
    OPENAI_PATH,
    FakeLLMServer,
    Reply,
    running,
)
from model_runs import of_kind, stored, until_stopped
from provider_replies import answer, lookup

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.models import from_spec
from tether.models.anthropic import AnthropicModel
from tether.models.base import Model
from tether.models.openai import OpenAIChatModel
from tether.store.sql.schema import runs

DEADLINE_S = 30.0
FAST = {"model_retry_first_s": 0.01, "model_retry_max_s": 0.05}
PROVIDERS = ["openai", "anthropic"]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeLLMServer]]:
    with running(OPENAI_PATH) as openai, running(ANTHROPIC_PATH) as anthropic:
        yield {"openai": openai, "anthropic": anthropic}


@pytest.fixture(autouse=True)
def provider_env(servers: dict[str, FakeLLMServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """``TETHER_MODEL``'s adapters find the fake servers as they would a real endpoint."""
    for server in servers.values():
        server.reset()
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{servers['openai'].url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", servers["anthropic"].url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def engine_for(url: str, model: Model, **settings: Any) -> Engine:
    return Engine(
        agent=agents.agent(),
        model=model,
        settings=Settings(database_url=url, **{**FAST, **settings}),
        notifier=MemoryNotifier(),
    )


@pytest.fixture
async def opened() -> AsyncIterator[list[Engine]]:
    """Engines a test opens; each is closed (and its model's client with it) at the end."""
    engines: list[Engine] = []
    yield engines
    for engine in engines:
        await engine.aclose()


async def start(engines: list[Engine], url: str, spec: str, **settings: Any) -> tuple[Engine, str]:
    """An engine on ``url`` whose model is ``TETHER_MODEL=spec``, and a run of dana's."""
    engine = engine_for(url, from_spec(spec), **settings)
    engines.append(engine)
    run = await engine.start_run("dana", "look it up")
    return engine, run.id


def ready_at(engine: Engine, run_id: str) -> float | None:
    with engine.runner.store.engine.connect() as conn:
        value = conn.execute(sa.select(runs.c.ready_at).where(runs.c.id == run_id)).scalar()
    return None if value is None else float(value)


def sent_messages(server: FakeLLMServer) -> list[list[Any]]:
    """The history each request carried (the system prompt travels apart on Anthropic)."""
    return [request.body["messages"] for request in server.requests]


# -- transient failures are retried from the stored messages ----------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_429_then_500_then_success_answers_after_a_model_retry_each_time(
    db_url: str,
    provider: str,
    servers: dict[str, FakeLLMServer],
    opened: list[Engine],
) -> None:
    server = servers[provider]
    server.script(
        Reply.failure(429, "slow down"),
        Reply.failure(500, "upstream exploded"),
        answer(provider, "all good"),
    )
    engine, run_id = await start(opened, db_url, f"{provider}:test-model")

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "all good"
    retries = await of_kind(engine, run_id, "model_retry")
    assert [e.data["attempt"] for e in retries] == [1, 2]
    assert "HTTP 429: slow down" in retries[0].data["error"]
    assert "HTTP 500: upstream exploded" in retries[1].data["error"]
    assert [e.data["status"] for e in retries] == [429, 500]
    for event in retries:
        assert datetime.fromisoformat(event.data["retry_at"]).tzinfo is not None
    # Each try sent the same stored history; nothing of the failures reached it.
    histories = sent_messages(server)
    assert len(histories) == 3 and histories[0] == histories[1] == histories[2]
    run = stored(engine, run_id)
    assert run.model_failures == 0  # the stored answer reset the count
    assert run.budget.steps == 1
    roles = [m["role"] for m in (await engine.get_run(run_id)).messages]
    assert roles == ["system", "user", "assistant"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_run_waiting_out_its_backoff_has_no_owner_and_is_not_claimable(
    db_url: str,
    provider: str,
    servers: dict[str, FakeLLMServer],
    opened: list[Engine],
) -> None:
    server = servers[provider]
    server.script(Reply.failure(529, "overloaded"), answer(provider, "back"))
    # The default first backoff (1 s): long enough to look at the run while it waits.
    engine, run_id = await start(
        opened, db_url, f"{provider}:test-model", model_retry_first_s=1.0, model_retry_max_s=300
    )

    first = await engine.run_until_stop(run_id)

    assert first.kind is StopKind.RELEASED and first.reason == "model_retry"
    run = stored(engine, run_id)
    assert run.state.value == "running" and run.owner is None
    assert run.model_failures == 1
    waits_until = ready_at(engine, run_id)
    assert waits_until is not None and waits_until > engine.runner.store.now()
    assert await engine.runner.claim() is None  # no worker may take it yet
    (retry,) = await of_kind(engine, run_id, "model_retry")
    assert retry.data["attempt"] == 1 and "HTTP 529: overloaded" in retry.data["error"]
    assert datetime.fromisoformat(retry.data["retry_at"]).timestamp() == pytest.approx(
        waits_until, abs=1e-3
    )
    # At least the first backoff, at most a tenth more (the jitter), on the DB clock.
    assert 1.0 - 0.05 <= waits_until - retry.at <= 1.1 + 0.05

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "back"
    assert ready_at(engine, run_id) is None
    assert server.count() == 2


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_timeout_is_transient_and_the_run_is_retried(
    db_url: str,
    provider: str,
    servers: dict[str, FakeLLMServer],
    opened: list[Engine],
) -> None:
    server = servers[provider]
    server.script(Reply.hung(), answer(provider, "on time"))
    # The retry must be answered within the same timeout: 1 s, since on a loaded machine
    # (the tiers run in parallel) the fake's answer took more than 0.3 s and timed out too.
    model: Model
    if provider == "openai":
        model = OpenAIChatModel("test-model", timeout_s=1.0, max_retries=0)
    else:
        model = AnthropicModel("test-model", timeout_s=1.0, max_retries=0)
    engine = engine_for(db_url, model)
    opened.append(engine)
    run_id = (await engine.start_run("dana", "look it up")).id

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "on time"
    (retry,) = await of_kind(engine, run_id, "model_retry")
    assert retry.data["attempt"] == 1 and "timed out after 1s" in retry.data["error"]
    assert "status" not in retry.data


async def test_a_model_that_cannot_be_reached_is_transient(
    db_url: str, opened: list[Engine]
) -> None:
    with running(OPENAI_PATH) as gone:
        url = f"{gone.url}/v1"
    model = OpenAIChatModel("test-model", base_url=url, api_key="sk-test", max_retries=0)
    engine = engine_for(db_url, model, max_model_attempts=2)
    opened.append(engine)
    run_id = (await engine.start_run("dana", "look it up")).id

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.FAILED and outcome.reason == "model_unavailable"
    (retry,) = await of_kind(engine, run_id, "model_retry")
    assert "could not be reached" in retry.data["error"]


async def test_the_sdks_own_retries_of_one_call_count_as_one_failed_call(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    server = servers["openai"]
    again = {"x-should-retry": "true", "retry-after-ms": "1"}
    server.script(
        Reply.failure(500, "blip", **again),
        Reply.failure(500, "blip again"),
        answer("openai", "fine"),
    )
    model = OpenAIChatModel("test-model", max_retries=1)
    # Two consecutive failed calls would fail the run: the SDK's two HTTP tries are one.
    engine = engine_for(db_url, model, max_model_attempts=2)
    opened.append(engine)
    run_id = (await engine.start_run("dana", "look it up")).id

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.ANSWERED
    assert server.count() == 3
    (retry,) = await of_kind(engine, run_id, "model_retry")
    assert retry.data["attempt"] == 1 and "blip again" in retry.data["error"]


# -- giving up ---------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_max_consecutive_transient_failures_fail_the_run_model_unavailable(
    db_url: str,
    provider: str,
    servers: dict[str, FakeLLMServer],
    opened: list[Engine],
) -> None:
    server = servers[provider]
    server.script(*(Reply.failure(503, f"down {i}") for i in range(3)))
    engine, run_id = await start(opened, db_url, f"{provider}:test-model", max_model_attempts=3)

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.FAILED and outcome.reason == "model_unavailable"
    assert server.count() == 3
    retries = await of_kind(engine, run_id, "model_retry")
    assert [e.data["attempt"] for e in retries] == [1, 2]
    (failed,) = await of_kind(engine, run_id, "failed")
    assert failed.data["reason"] == "model_unavailable"
    assert failed.data["attempts"] == 3 and "HTTP 503: down 2" in failed.data["error"]
    run = stored(engine, run_id)
    assert run.state.value == "failed" and run.fail_reason == "model_unavailable"
    assert run.owner is None and run.budget.steps == 0


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("status", "message"),
    [(401, "Incorrect API key provided"), (400, "Invalid schema for function 'lookup'")],
)
async def test_a_permanent_error_fails_the_run_model_error_at_once_with_the_providers_message(
    db_url: str,
    provider: str,
    status: int,
    message: str,
    servers: dict[str, FakeLLMServer],
    opened: list[Engine],
) -> None:
    server = servers[provider]
    server.script(Reply.failure(status, message), answer(provider, "never asked"))
    engine, run_id = await start(opened, db_url, f"{provider}:test-model")

    outcome = await engine.run_until_stop(run_id)

    assert outcome.kind is StopKind.FAILED and outcome.reason == "model_error"
    assert server.count() == 1
    assert await of_kind(engine, run_id, "model_retry") == []
    (failed,) = await of_kind(engine, run_id, "failed")
    assert failed.data["reason"] == "model_error" and failed.data["status"] == status
    assert f"HTTP {status}: {message}" in failed.data["error"]
    assert stored(engine, run_id).fail_reason == "model_error"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_successful_call_resets_the_count_so_scattered_failures_never_reach_the_max(
    db_url: str,
    provider: str,
    servers: dict[str, FakeLLMServer],
    opened: list[Engine],
) -> None:
    server = servers[provider]
    server.script(
        Reply.failure(429, "busy 1"),
        lookup(provider, "call_a"),
        Reply.failure(500, "busy 2"),
        lookup(provider, "call_b"),
        Reply.failure(529, "busy 3"),
        answer(provider, "made it"),
    )
    # Two consecutive failures would fail it; it meets three, never two in a row.
    engine, run_id = await start(opened, db_url, f"{provider}:test-model", max_model_attempts=2)

    outcome = await until_stopped(engine, run_id)

    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "made it"
    retries = await of_kind(engine, run_id, "model_retry")
    assert [e.data["attempt"] for e in retries] == [1, 1, 1]
    run = stored(engine, run_id)
    assert run.model_failures == 0 and run.budget.steps == 3 and run.budget.tool_calls == 2
    # Each retry resent exactly what the failed call had sent.
    histories = sent_messages(server)
    assert histories[0] == histories[1] and histories[2] == histories[3]
    assert histories[4] == histories[5] and len(histories[4]) > len(histories[2])


async def test_the_runs_json_shows_each_model_fail_reason(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    servers["openai"].script(Reply.failure(401, "bad key"), Reply.failure(500, "down"))
    engine, denied = await start(opened, db_url, "openai:test-model", max_model_attempts=1)
    down = (await engine.start_run("dana", "again")).id
    await engine.operator.add_user("dana", "key-of-dana")
    assert (await engine.run_until_stop(denied)).reason == "model_error"
    assert (await engine.run_until_stop(down)).reason == "model_unavailable"

    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    headers = {"Authorization": "Bearer key-of-dana"}
    async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as client:
        bodies = [
            (await client.get(f"/v1/runs/{run_id}", headers=headers)).json()
            for run_id in (denied, down)
        ]

    assert [(b["state"], b["fail_reason"]) for b in bodies] == [
        ("failed", "model_error"),
        ("failed", "model_unavailable"),
    ]
