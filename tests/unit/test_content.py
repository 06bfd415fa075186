"""The one gate of content in logs and spans (``tether.telemetry.content``, reference §20):
a value or an error's message only where the setting allows it; an error otherwise by its
type and frames; database errors without their statement or parameters; the log handlers
of tether's processes strip messages from any library's tracebacks; spans record errors
by type unless ``TETHER_OTEL_CONTENT``; and no metric has a label that could hold content."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.metrics import MetricWrapperBase
from sqlalchemy import exc as sa_exc

from tether.errors import ModelError
from tether.telemetry import content, logs, metrics, tracing

SECRET = "zqsecretmark"


def _raised() -> BaseException:
    """An error with a cause, both messages secret, as a caught exception."""
    try:
        try:
            raise KeyError(SECRET)
        except KeyError as inner:
            raise RuntimeError(f"wrapped {SECRET}") from inner
    except RuntimeError as exc:
        return exc


def test_a_value_is_shown_only_when_allowed() -> None:
    assert content.shown({"q": SECRET}, False) is None
    assert json.loads(content.shown({"q": SECRET}, True) or "") == {"q": SECRET}
    assert content.shown("x" * 20000, True) == "x" * content.MAX_CHARS
    assert content.fields(False, answer=SECRET) == {}
    assert content.fields(True, answer=SECRET, preview=None) == {"answer": SECRET}


def test_an_error_is_told_by_its_type_and_frames_unless_allowed() -> None:
    exc = _raised()
    told = content.failure(exc, False, run_id="r1")
    assert "exc_info" not in told and SECRET not in json.dumps(told)
    assert told["extra"]["run_id"] == "r1" and told["extra"]["error_type"] == "RuntimeError"
    trace = told["extra"]["trace"]
    assert "KeyError" in trace and "RuntimeError" in trace and "_raised" in trace
    allowed = content.failure(exc, True, run_id="r1")
    assert allowed["exc_info"] is exc and SECRET in allowed["extra"]["error"]
    assert content.described(exc, False) == "RuntimeError"
    assert content.described(ModelError(SECRET), False) == "tether.errors.ModelError"


def test_a_database_error_is_told_without_its_statement_or_parameters() -> None:
    driver = sqlite3.OperationalError("database is locked")
    wrapped = sa_exc.OperationalError("INSERT INTO messages VALUES (?)", (SECRET,), driver)
    assert SECRET in str(wrapped)
    assert content.db_error(wrapped) == "OperationalError: database is locked"
    try:
        raise RuntimeError("retrying") from wrapped
    except RuntimeError as outer:
        assert content.db_error(outer) == "OperationalError: database is locked"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    logs.configure("INFO")
    out = io.StringIO()
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    try:
        yield out
    finally:
        root.handlers[:], root.level = saved, level


def test_the_process_handlers_strip_messages_from_any_traceback(stream: io.StringIO) -> None:
    other = logging.getLogger("some.library")
    other.error("failed", exc_info=_raised())
    [line] = [json.loads(s) for s in stream.getvalue().splitlines()]
    assert SECRET not in json.dumps(line) and "KeyError" in line["exc"]
    logs.show_content(True)
    other.error("failed", exc_info=_raised())
    assert SECRET in stream.getvalue().splitlines()[-1]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


@pytest.mark.parametrize("allowed", [False, True])
def test_a_span_carries_content_only_with_its_setting(
    exporter: InMemorySpanExporter, allowed: bool
) -> None:
    with pytest.raises(ModelError):
        with tracing.model_call("openai:m", 1, content=allowed, messages=[{"content": SECRET}]):
            raise ModelError(f"provider said {SECRET}", transient=True)
    with tracing.tool_call("t", "c1", key="k", effect="read", content=allowed, arguments=SECRET):
        tracing.tool_outcome("ok", counted=True, result={"r": SECRET})
    spans = exporter.get_finished_spans()
    text = " ".join(
        json.dumps(
            {
                "attributes": dict(span.attributes or {}),
                "events": [dict(e.attributes or {}) for e in span.events],
                "status": span.status.description,
            }
        )
        for span in spans
    )
    assert (SECRET in text) is allowed
    chat = next(s for s in spans if s.name == "chat m")
    [event] = chat.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] in ("tether.errors.ModelError", "ModelError")


# The labels metrics may have: names (a tool's, a model's entry in TETHER_MODEL, both the
# operator's configuration), codes and states, never content.
LABELS = {"tool", "model", "outcome", "limit", "state", "reason"}


def test_no_metric_has_a_label_that_could_hold_content() -> None:
    declared = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(declared) >= 9
    for metric in declared:
        assert set(metric._labelnames) <= LABELS, metric
