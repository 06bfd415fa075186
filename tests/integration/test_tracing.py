"""OpenTelemetry spans of a run (reference §11, ``tether.telemetry.tracing``), on both backends.

Each test traces into its own SDK ``TracerProvider`` with an in-memory exporter, handed to
tether with ``tracing.use_provider`` (the global provider can be set once per process).
A second ``Engine`` on the same database stands in for another process: it shares
nothing with the first but the database, so a span it emits can only land in the run's
trace through the trace context stored with the run. The crash test with real processes
exporting over OTLP is tests/acceptance/test_trace_crash.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import inprocess
import processes
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tether import Engine, MemoryNotifier, StopKind
from tether.config import Settings
from tether.errors import AlreadyResumed, ModelError, UnknownOrExpired
from tether.models.base import Message, Model, ModelResponse, ToolSpec
from tether.telemetry import tracing


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    tracing.use_provider(provider)
    try:
        yield provider
    finally:
        tracing.use_provider(None)
        provider.shutdown()


@pytest.fixture
def exporter(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def one(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return int(context.span_id)


def trace_ids(spans: tuple[ReadableSpan, ...]) -> set[int]:
    return {s.context.trace_id for s in spans if s.context is not None}


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


async def test_a_run_traces_its_stretch_steps_model_calls_and_tool_calls(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    engine = inprocess.engine(db_url, script_name="work")  # lookup; record; answer
    async with engine:
        outcome = await engine.ask("dana", "work")
        ledger = await engine.ledger(outcome.run_id)
    assert outcome.kind is StopKind.ANSWERED
    spans = exporter.get_finished_spans()
    assert len(trace_ids(spans)) == 1
    created = one(spans, "create_run kit")
    stretch = one(spans, "invoke_agent kit")
    assert parent_id(created) is None and parent_id(stretch) == span_id(created)
    assert attr(stretch, "gen_ai.operation.name") == "invoke_agent"
    assert attr(stretch, "tether.run.id") == outcome.run_id
    assert attr(stretch, "tether.run.stretch") == "carry"
    assert attr(stretch, "tether.run.outcome") == "answered"
    steps = [one(spans, f"step {n}") for n in (1, 2, 3)]
    assert all(parent_id(step) == span_id(stretch) for step in steps)
    chats = named(spans, "chat ")
    assert [parent_id(c) for c in chats] == [span_id(s) for s in steps]
    for chat in chats:
        assert chat.name == "chat scripted"
        assert attr(chat, "gen_ai.operation.name") == "chat"
        assert attr(chat, "gen_ai.provider.name") == "scripted"
        assert attr(chat, "gen_ai.request.model") == "scripted"
        assert attr(chat, "gen_ai.response.model") == "scripted"
        assert attr(chat, "gen_ai.usage.input_tokens") == 1000
        assert attr(chat, "gen_ai.usage.output_tokens") == 100
    lookup = one(spans, "execute_tool lookup")
    record = one(spans, "execute_tool record")
    assert parent_id(lookup) == span_id(steps[0]) and parent_id(record) == span_id(steps[1])
    for span, entry, effect in ((lookup, ledger[0], "read"), (record, ledger[1], "write")):
        assert attr(span, "gen_ai.operation.name") == "execute_tool"
        assert attr(span, "gen_ai.tool.name") == entry.tool
        assert attr(span, "gen_ai.tool.call.id") == entry.tool_call_id
        assert attr(span, "tether.idempotency_key") == f"{outcome.run_id}:{entry.tool_call_id}"
        assert attr(span, "tether.tool.effect") == effect
        assert attr(span, "tether.tool.outcome") == "ok"


async def test_the_run_trace_is_a_child_of_the_span_that_started_it(
    db_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    async with engine:
        with provider.get_tracer("app").start_as_current_span("handle request") as caller:
            run = await engine.start_run("dana", "hi")
        await engine.run_until_stop(run.id)
    spans = exporter.get_finished_spans()
    assert run.trace_context is not None and "traceparent" in run.trace_context
    assert parent_id(one(spans, "create_run kit")) == caller.get_span_context().span_id
    assert trace_ids(spans) == {caller.get_span_context().trace_id}


async def test_an_approval_in_another_engine_continues_the_same_trace(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    notifier = MemoryNotifier()
    first = inprocess.engine(db_url, script_name="send", notifier=notifier)
    second = inprocess.engine(db_url, script_name="send")
    async with first, second:
        outcome = await first.ask("dana", "send b")
        assert outcome.kind is StopKind.SUSPENDED
        token = notifier.last(outcome.run_id).token
        result = await second.resume_after_confirmation(token, "approve", "boss", reason="ok")
        assert result.outcome == "executed"
        with pytest.raises(AlreadyResumed):
            await second.resume_after_confirmation(token, "decline", "dana")
        assert (await second.run_until_stop(outcome.run_id)).kind is StopKind.ANSWERED
    spans = exporter.get_finished_spans()
    created = one(spans, "create_run kit")
    assert len(trace_ids(spans)) == 1
    suspended, executed = named(spans, "execute_tool send")
    assert attr(suspended, "tether.tool.outcome") == "suspended"
    assert attr(executed, "tether.tool.outcome") == "ok"
    approved, refused = named(spans, "approval")
    assert parent_id(approved) == span_id(created) == parent_id(refused)
    assert parent_id(executed) == span_id(approved)
    assert approved.name == "approval send"
    assert attr(approved, "tether.approval.decision") == "approve"
    assert attr(approved, "tether.approval.approver") == "boss"
    assert attr(approved, "tether.approval.edited") is False
    assert attr(approved, "tether.approval.reason") is True
    assert attr(approved, "tether.approval.outcome") == "executed"
    assert attr(refused, "tether.approval.decision") == "decline"
    assert attr(refused, "tether.approval.outcome") == "already_resumed"
    assert refused.status.status_code is not StatusCode.ERROR  # a refusal is an answer
    stretches = named(spans, "invoke_agent kit")
    assert len(stretches) == 2 and all(parent_id(s) == span_id(created) for s in stretches)


async def test_an_unknown_token_is_traced_as_a_refused_approval_outside_any_run(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    async with inprocess.engine(db_url) as engine:
        with pytest.raises(UnknownOrExpired):
            await engine.resume_after_confirmation("t" * 43, "approve", "dana")
    refused = one(exporter.get_finished_spans(), "approval")
    assert parent_id(refused) is None and attr(refused, "tether.run.id") is None
    assert attr(refused, "tether.approval.outcome") == "unknown_or_expired"


async def test_a_halted_run_continued_keeps_its_trace(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    other = inprocess.engine(db_url, script_name="work")
    async with engine, other:
        outcome = await engine.ask("dana", "work", limits={"max_steps": 1})
        assert outcome.kind is StopKind.HALTED
        await other.continue_run(outcome.run_id, "dana")
        assert (await other.run_until_stop(outcome.run_id)).kind is StopKind.ANSWERED
    spans = exporter.get_finished_spans()
    created = one(spans, "create_run kit")
    assert len(trace_ids(spans)) == 1
    continued = one(spans, "continue_run")
    assert parent_id(continued) == span_id(created)
    assert attr(continued, "tether.continue.by") == "dana"
    assert attr(continued, "tether.continue.halt_reason") == "max_steps"
    halted, finished = named(spans, "invoke_agent kit")
    assert attr(halted, "tether.run.outcome") == "halted"
    assert attr(finished, "tether.run.outcome") == "answered"
    # The continued stretch begins with the rest of step 1 (its lookup was stored with it).
    assert {s.name for s in spans if parent_id(s) == span_id(finished)} == {"step 2", "step 3"}


class Refusing(Model):
    """A model whose provider refuses every request (HTTP 400)."""

    name = "acme:big-1"

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        raise ModelError("acme failed with HTTP 400: bad request", status=400)


async def test_a_failed_model_call_is_an_error_span_with_its_error_type(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    engine = Engine(agent=agents.agent(), model=Refusing(), settings=Settings(database_url=db_url))
    async with engine:
        outcome = await engine.ask("dana", "hi")
    assert outcome.kind is StopKind.FAILED
    chat = one(exporter.get_finished_spans(), "chat big-1")
    assert attr(chat, "gen_ai.provider.name") == "acme"
    assert attr(chat, "error.type") == "400"
    assert chat.status.status_code is StatusCode.ERROR
    assert [e.name for e in chat.events] == ["exception"]


async def test_a_refused_call_says_why_on_its_span(
    db_url: str, exporter: InMemorySpanExporter
) -> None:
    turns = [{"tool_calls": [agents.call("no_such_tool"), agents.call("lookup", query="q")]}]
    async with inprocess.engine(db_url, turns=turns) as engine:
        assert (await engine.ask("dana", "hi")).kind is StopKind.ANSWERED
    spans = exporter.get_finished_spans()
    refused = one(spans, "execute_tool no_such_tool")
    assert attr(refused, "tether.tool.outcome") == "refused"
    assert attr(refused, "tether.tool.error") == "unknown_tool"
    assert attr(refused, "tether.tool.effect") is None
    assert attr(one(spans, "execute_tool lookup"), "tether.tool.outcome") == "ok"


async def test_without_a_tracer_provider_a_run_stores_no_trace_context(db_url: str) -> None:
    async with inprocess.engine(db_url, script_name="answer") as engine:
        run = await engine.start_run("dana", "hi")
        assert (await engine.run_until_stop(run.id)).kind is StopKind.ANSWERED
        stored = (await engine.get_run(run.id)).run
    assert run.trace_context is None and stored is not None and stored.trace_context is None


def test_the_documented_example_prints_the_span_tree_it_shows(tmp_path: Path) -> None:
    page = (processes.ROOT / "docs" / "integrations.md").read_text()
    section = page.split("## Tracing with OpenTelemetry", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(# trace_example\.py\n.*?)```", section, re.S)
    shown = re.search(r"It prints:\n\n```text\n(.*?)```", section, re.S)
    assert code is not None and shown is not None
    (tmp_path / "trace_example.py").write_text(code.group(1))
    ran = subprocess.run(
        [sys.executable, "trace_example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "OTEL_"))},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == shown.group(1)


WITHOUT_OTEL = """
import asyncio, os, sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from tether import Agent, Engine, ScriptedModel
from tether.telemetry import export, tracing

os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"  # ignored without the extra


async def main() -> None:
    agent = Agent(name="plain", system_prompt="p")
    model = ScriptedModel([{"content": "done"}])
    with export.exporting():
        async with Engine(agent=agent, model=model, database_url=sys.argv[1], migrate=True) as e:
            outcome = await e.ask("dana", "hi")
            run = (await e.get_run(outcome.run_id)).run
    assert run is not None
    print(outcome.kind.value, run.trace_context, tracing.on())


asyncio.run(main())
"""


def test_without_the_otel_extra_runs_work_and_trace_nothing(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, f"sqlite:///{tmp_path / 'plain.db'}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "OTEL_"))},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "answered None False\n"
