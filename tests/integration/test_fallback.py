"""Falling back across a list of models (reference §21), on both backends, through the real
``openai:``, ``anthropic:`` and ``gemini:`` adapters talking HTTP to local fake servers.

Each step tries the list from its first model and goes to the next at once when one fails;
the stored turn names the model that answered and is priced at its price; a step that no
model answered is one failure for ``TETHER_MAX_MODEL_ATTEMPTS`` (reference §10), and only
a step that every model refused for good fails the run ``model_error``. A model that broke
off mid-stream has its text replaced, from offset 0, by the next one's (reference §16).
A run whose steps go to each provider in turn keeps one conversation that every provider
accepts (``provider_rules.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import agents
import pytest
from fakellm import (
    ANTHROPIC_PATH,
    GEMINI_PATH,
    OPENAI_PATH,
    FakeLLMServer,
    Reply,
    anthropic_message,
    running,
)
from model_runs import of_kind, stored, until_stopped
from provider_replies import answer, lookup
from provider_rules import check_anthropic, check_gemini, check_openai
from waiting import until

from tether import Engine, MemoryNotifier, StopKind
from tether.config import Settings
from tether.models import from_spec
from tether.models.base import Usage
from tether.models.pricing import spend_usd
from tether.results import Delta, LiveEvent
from tether.telemetry.metrics import REGISTRY

DEADLINE_S = 30.0
FAST = {"model_retry_first_s": 0.01, "model_retry_max_s": 0.05}
OPENAI = "openai:gpt-4o-mini"
ANTHROPIC = "anthropic:claude-haiku-4-5"
GEMINI = "gemini:gemini-2.5-flash"
BOTH = f"{OPENAI}|{ANTHROPIC}"


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeLLMServer]]:
    with (
        running(OPENAI_PATH) as openai,
        running(ANTHROPIC_PATH) as anthropic,
        running(GEMINI_PATH) as gemini,
    ):
        yield {"openai": openai, "anthropic": anthropic, "gemini": gemini}


@pytest.fixture(autouse=True)
def provider_env(servers: dict[str, FakeLLMServer], monkeypatch: pytest.MonkeyPatch) -> None:
    for server in servers.values():
        server.reset()
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{servers['openai'].url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", servers["anthropic"].url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_BASE_URL", servers["gemini"].url)
    monkeypatch.setenv("GEMINI_API_KEY", "gm-test")


@pytest.fixture
async def opened() -> AsyncIterator[list[Engine]]:
    engines: list[Engine] = []
    yield engines
    for engine in engines:
        await engine.aclose()


async def start(
    engines: list[Engine], url: str, spec: str = BOTH, **settings: Any
) -> tuple[Engine, str]:
    engine = Engine(
        agent=agents.agent(),
        model=from_spec(spec),
        settings=Settings(database_url=url, **{**FAST, **settings}),
        notifier=MemoryNotifier(),
    )
    engines.append(engine)
    run = await engine.start_run("dana", "look it up")
    return engine, run.id


def calls(model: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "tether_model_calls_total", {"model": model, "outcome": outcome}
    )
    return value or 0.0


def down(status: int = 503) -> Reply:
    return Reply.failure(status, f"the model says {status}")


async def test_a_failing_first_model_hands_the_step_to_the_next_which_it_names_and_prices(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    servers["openai"].script(down())
    servers["anthropic"].script(answer("anthropic", "from claude", input_tokens=1000))
    before = {(m, o): calls(m, o) for m in (OPENAI, ANTHROPIC) for o in ("answered", "transient")}
    engine, run_id = await start(opened, db_url)
    outcome = await engine.run_until_stop(run_id)
    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "from claude"
    [turn] = await of_kind(engine, run_id, "model_turn")
    assert turn.data["model"] == ANTHROPIC
    assert await of_kind(engine, run_id, "model_retry") == []
    # Priced at the model that answered, not the first of the list.
    usage = Usage(input_tokens=1000, output_tokens=5)
    expected = spend_usd("claude-haiku-4-5", usage)
    assert expected != spend_usd("gpt-4o-mini", usage)
    assert turn.data["spend_usd"] == pytest.approx(expected)
    assert stored(engine, run_id).budget.spend_usd == pytest.approx(expected)
    assert calls(OPENAI, "transient") == before[(OPENAI, "transient")] + 1
    assert calls(ANTHROPIC, "answered") == before[(ANTHROPIC, "answered")] + 1
    assert calls(OPENAI, "answered") == before[(OPENAI, "answered")]


async def test_each_step_starts_again_at_the_first_model(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    # Step 1: OpenAI is down, Claude calls the tool; step 2: OpenAI is back and answers,
    # handed the tool call Claude wrote and its result.
    servers["openai"].script(down(), answer("openai", "from gpt"))
    servers["anthropic"].script(lookup("anthropic", "toolu_01"))
    engine, run_id = await start(opened, db_url)
    outcome = await engine.run_until_stop(run_id)
    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "from gpt"
    turns = await of_kind(engine, run_id, "model_turn")
    assert [t.data["model"] for t in turns] == [ANTHROPIC, OPENAI]
    sent = servers["openai"].requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[2]["tool_calls"][0]["id"] == sent[3]["tool_call_id"]


async def test_steps_that_go_to_each_provider_in_turn_keep_one_conversation_each_accepts(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    # OpenAI fails every other call; once Claude fails too, Gemini takes the step.
    gpt, claude, gemini = servers["openai"], servers["anthropic"], servers["gemini"]
    gpt.script(lookup("openai", "call_a"), down(), lookup("openai", "call_c"), down())
    gpt.script(answer("openai", "all looked up"))
    claude.script(lookup("anthropic", "toolu_b"), down(529))
    gemini.script(lookup("gemini", "d"))
    engine, run_id = await start(opened, db_url, f"{OPENAI}|{ANTHROPIC}|{GEMINI}")
    outcome = await engine.run_until_stop(run_id)
    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "all looked up"
    turns = await of_kind(engine, run_id, "model_turn")
    assert [t.data["model"] for t in turns] == [OPENAI, ANTHROPIC, OPENAI, GEMINI, OPENAI]
    # Every request each provider got was valid for it, the last one with the whole run.
    for server, check in ((gpt, check_openai), (claude, check_anthropic), (gemini, check_gemini)):
        assert server.requests
        for request in server.requests:
            check(request.body)
    last = gpt.requests[-1].body["messages"]
    queries = [m for m in last if m["role"] == "tool"]
    assert len(queries) == 4 and [q["content"] for q in queries] == [
        m["content"] for m in engine.runner.store.messages(run_id) if m["role"] == "tool"
    ]
    asked = [c["id"] for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    assert len(set(asked)) == 4 and asked[:3] == ["call_a", "toolu_b", "call_c"]
    # Gemini was handed the calls OpenAI and Claude wrote, each answered by name.
    sent = gemini.requests[-1].body["contents"]
    answered = [
        p.get("functionResponse") or p.get("function_response")
        for c in sent
        for p in c["parts"]
        if "functionResponse" in p or "function_response" in p
    ]
    assert [r["name"] for r in answered] == ["lookup"] * 3


async def test_a_step_no_model_answers_is_one_failure_and_backs_off_before_the_list_again(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    servers["openai"].script(down(429), answer("openai", "at last"))
    servers["anthropic"].script(down(529))
    engine, run_id = await start(opened, db_url)
    first = await engine.run_until_stop(run_id)
    assert first.kind is StopKind.RELEASED and first.reason == "model_retry"
    [retry] = await of_kind(engine, run_id, "model_retry")
    assert retry.data["attempt"] == 1
    assert f"{OPENAI}: " in retry.data["error"] and f"{ANTHROPIC}: " in retry.data["error"]
    assert stored(engine, run_id).model_failures == 1
    outcome = await until_stopped(engine, run_id)
    assert outcome.kind is StopKind.ANSWERED and outcome.answer == "at last"
    assert (servers["openai"].count(), servers["anthropic"].count()) == (2, 1)
    assert stored(engine, run_id).model_failures == 0


async def test_max_model_attempts_counts_steps_that_no_model_answered_not_models(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    servers["openai"].script(down(), down())
    servers["anthropic"].script(down(), down())
    engine, run_id = await start(opened, db_url, max_model_attempts=2)
    outcome = await until_stopped(engine, run_id)
    assert outcome.kind is StopKind.FAILED and outcome.reason == "model_unavailable"
    assert len(await of_kind(engine, run_id, "model_retry")) == 1
    assert (servers["openai"].count(), servers["anthropic"].count()) == (2, 2)


async def test_model_error_only_when_every_model_of_the_list_refused_for_good(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    # One refuses for good, the other is down: the list may answer later.
    servers["openai"].script(down(404), down(404), answer("openai", "unused"))
    servers["anthropic"].script(down(503), down(401))
    engine, run_id = await start(opened, db_url)
    first = await engine.run_until_stop(run_id)
    assert first.kind is StopKind.RELEASED and first.reason == "model_retry"
    # Both refuse for good: the run fails at once, each model's refusal in its event.
    outcome = await until_stopped(engine, run_id)
    assert outcome.kind is StopKind.FAILED and outcome.reason == "model_error"
    [failed] = await of_kind(engine, run_id, "failed")
    assert "HTTP 404" in failed.data["error"] and "HTTP 401" in failed.data["error"]
    assert servers["openai"].count() == 2


async def test_a_model_that_broke_off_mid_stream_has_its_text_replaced_from_offset_0(
    db_url: str, servers: dict[str, FakeLLMServer], opened: list[Engine]
) -> None:
    gpt = answer("openai", "the first model began this answer")
    servers["openai"].script(Reply.broken(gpt.body, "drop"))
    text = "the second model wrote the whole of this"
    servers["anthropic"].script(Reply(body=anthropic_message([{"type": "text", "text": text}])))
    engine, run_id = await start(opened, db_url)
    watching = asyncio.create_task(_collect(engine, run_id))
    hub = engine.runner.services.deltas
    assert hub is not None
    await until(lambda: any(r.watchers for r in hub._runs.values()), what="the watcher")
    outcome = await engine.run_until_stop(run_id)
    assert outcome.kind is StopKind.ANSWERED and outcome.answer == text
    async with asyncio.timeout(DEADLINE_S):
        seen = await watching
    deltas = [d for d in seen if isinstance(d, Delta)]
    restarts = [i for i, d in enumerate(deltas) if d.offset == 0]
    assert len(restarts) == 2, deltas  # the first model's text, then the second's from 0
    written = ""
    for delta in deltas[restarts[1] :]:
        assert delta.offset == len(written), deltas
        written += delta.text
    assert written == text
    assert "".join(d.text for d in deltas[: restarts[1]]) != text
    [turn] = [e for e in seen if isinstance(e, LiveEvent) and e.kind == "model_turn"]
    assert turn.data["text"] == text and turn.data["model"] == ANTHROPIC


async def _collect(engine: Engine, run_id: str) -> list[LiveEvent | Delta]:
    return [item async for item in engine.watch(run_id, deltas=True)]
