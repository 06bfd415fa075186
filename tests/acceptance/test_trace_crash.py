"""A run's trace survives a crash (reference §11 tracing, §7 failpoints), with real processes.

``tether worker`` subprocesses and a ``tether reap`` export their spans over OTLP/HTTP to a
real wire-format receiver (tests/support/otlp.py). The first worker is killed by
``after_tool_commit:record=crash`` (``os._exit(137)``) once its first span has reached
the receiver; the reaper recovers the run in another process and a third process
finishes it. Every span any of them exported belongs to the trace whose context was
stored with the run when it was created.
"""

from __future__ import annotations

import functools
import subprocess

import downstream
import heartbeats
import otlp
import processes
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from waiting import poll_until

from tether import Engine, ScriptedModel
from tether.config import Settings
from tether.runs import Run
from tether.store import Store
from tether.telemetry import tracing


def _tether(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return processes.tether(*args, env=env, timeout=120, agent="otlp:agent")


def _env(url: str, receiver: otlp.Receiver, process: str, **extra: str) -> dict[str, str]:
    return processes.tether_env(
        url,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_SERVICE_NAME="tether-test",
        OTEL_RESOURCE_ATTRIBUTES=f"{otlp.PROCESS_ATTR}={process}",
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTLP_TEST_PROCESS=process,
        **extra,
    )


def _created(url: str, receiver: otlp.Receiver) -> Run:
    """A run created in this process, its creation span exported to the receiver."""
    provider = TracerProvider(resource=Resource.create({otlp.PROCESS_ATTR: "creator"}))
    exporter = OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    engine = Engine(
        agent=otlp.agent(), model=ScriptedModel(otlp.SCRIPT), settings=Settings(database_url=url)
    )
    try:
        return engine.sync.start_run("dana", "go")
    finally:
        engine.close()
        tracing.use_provider(None)
        provider.shutdown()


def test_the_spans_of_a_crashed_worker_and_its_recovery_share_the_run_trace(db_url: str) -> None:
    store = Store(db_url)
    try:
        with otlp.Receiver() as receiver:
            run = _created(db_url, receiver)
            failpoint = {"TETHER_FAILPOINTS": "after_tool_commit:record=crash"}
            crashed = _tether(
                "worker",
                "--exit-when-idle",
                "--no-reap",
                env=_env(db_url, receiver, "crashed", **failpoint),
            )
            assert crashed.returncode == 137, crashed.stderr[-3000:]
            poll_until(functools.partial(heartbeats.stale, store, run.id), what="a stale heartbeat")
            reaped = _tether("reap", env=_env(db_url, receiver, "reaper"))
            assert reaped.returncode == 0, reaped.stderr[-3000:]
            finished = _tether(
                "worker", "--exit-when-idle", "--no-reap", env=_env(db_url, receiver, "finisher")
            )
            assert finished.returncode == 0, finished.stderr[-3000:]
            spans = {
                p: receiver.of_process(p) for p in ("creator", "crashed", "reaper", "finisher")
            }
        final = store.get_run(run.id)
    finally:
        store.close()
    assert final is not None and final.state.value == "answered"
    assert [tool for _, tool, _ in downstream.effects()] == ["record"]  # recovered, not re-run
    assert run.trace_context is not None
    trace_id = run.trace_context["traceparent"].split("-")[1]
    assert all(spans.values()), {p: len(s) for p, s in spans.items()}
    assert {s.trace_id for ss in spans.values() for s in ss} == {trace_id}
    (created,) = spans["creator"]
    assert created.name == "create_run otlp"
    # The crashed worker's spans that had ended reached the receiver; its stretch span,
    # open when the process died, is lost with it (docs/integrations.md).
    assert "chat scripted" in {s.name for s in spans["crashed"]}
    assert not [s for s in spans["crashed"] if s.name.startswith("invoke_agent")]
    (recovery,) = [s for s in spans["reaper"] if s.name == "invoke_agent otlp"]
    assert recovery.parent_span_id == created.span_id
    assert recovery.attributes["tether.run.stretch"] == "recover"
    assert recovery.attributes["tether.run.outcome"] == "released"
    (reconciled,) = [s for s in spans["reaper"] if s.name == "execute_tool record"]
    assert reconciled.parent_span_id == recovery.span_id
    assert "tether.tool.reconciled" in reconciled.attributes
    assert reconciled.attributes["tether.tool.outcome"] == "ok"
    (carried,) = [s for s in spans["finisher"] if s.name == "invoke_agent otlp"]
    assert carried.parent_span_id == created.span_id
    assert carried.attributes["tether.run.outcome"] == "answered"
