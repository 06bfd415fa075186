"""No content where it does not belong (reference §20): ``tether serve`` as a real process
carries one run whose question, tool arguments and result, preview, decline reason and
answer each carry a marker, as do the messages of a tool's and the model's errors
(``content_agent.py``). Its logs (standard output and error), its ``/metrics`` and the
spans it exports over OTLP/HTTP to a receiver of the test's (``otlp.py``, scanned as the
raw bytes it got) carry none of them; with ``TETHER_LOG_CONTENT=1`` and
``TETHER_OTEL_CONTENT=1`` they carry every one, so the scan is one that can fail."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import otlp
import processes
from content_agent import MARKS
from served import free_port
from waiting import poll_until

from tether.store import Store
from tether.store.users import add_user

STOP_DEADLINE_S = 30


@dataclass(frozen=True)
class Written:
    """What the process wrote outside the database."""

    logs: str
    metrics: str
    spans: bytes
    span_names: frozenset[str]

    def marks_in(self, where: str) -> set[str]:
        """The kinds of content whose marker is in ``where``: logs, metrics or spans."""
        written = {"logs": self.logs.encode(), "metrics": self.metrics.encode()}
        scanned = written.get(where, self.spans)
        return {kind for kind, mark in MARKS.items() if mark.encode() in scanned}


def _state(client: httpx.Client, run_id: str, state: str) -> dict[str, Any] | None:
    body: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
    return body if body["state"] == state else None


def _one_run(client: httpx.Client) -> dict[str, Any]:
    """The marked run, from its question to its answer, with the write declined."""
    started = client.post("/v1/runs", json={"question": MARKS["question"]})
    assert started.status_code == 202, started.text
    run_id = started.json()["id"]
    suspended = poll_until(lambda: _state(client, run_id, "suspended"), what="the suspension")
    [pending] = suspended["pending_calls"]
    assert pending["preview"]["shown"] == MARKS["preview"]
    decision = {"tool_call_id": pending["tool_call_id"], "decision": "decline"}
    decided = client.post(
        f"/v1/runs/{run_id}/decisions",
        json={"decisions": [{**decision, "reason": MARKS["reason"]}]},
    )
    assert decided.status_code == 200, decided.text
    return poll_until(lambda: _state(client, run_id, "answered"), what="the answer")


def _serve_one_run(url: str, log: Path, **env: str) -> Written:
    """``tether serve`` carries the marked run; then it is stopped (its spans flushed on
    the way out) and what it wrote is gathered."""
    store = Store(url)
    try:
        key = add_user(store, "dana")
    finally:
        store.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with otlp.Receiver() as receiver:
        environment = processes.tether_env(
            url,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{receiver.url}/v1/traces",
            TETHER_MODEL_RETRY_FIRST_S="0.05",
            **env,
        )
        args = ("serve", "--port", str(port), "--workers", "1")
        proc = processes.spawn_agent(*args, agent="content_agent:agent", env=environment, log=log)
        try:
            poll_until(lambda: processes.serve_ready(proc, base, log), what="serve to be ready")
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
                answered = _one_run(client)
                metrics = client.get("/metrics").text
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=STOP_DEADLINE_S) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=STOP_DEADLINE_S)
        assert answered["answer"] == MARKS["answer"]  # the run did carry every marker
        names = frozenset(span.name for span in receiver.received())
        return Written(log.read_text(), metrics, receiver.raw(), names)


def _lines(logs: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in logs.splitlines() if line.startswith("{")]


def test_no_content_leaves_in_logs_metrics_or_spans(db_url: str, tmp_path: Path) -> None:
    written = _serve_one_run(db_url, tmp_path / "serve.log")
    # Each sink saw the run: the scan below looks at something.
    assert {"chat content", "execute_tool explode", "approval publish"} <= written.span_names
    assert b"tether.errors.ModelError" in written.spans  # the model's error, by its type
    assert 'tether_tool_call_seconds_count{tool="find"}' in written.metrics
    [raised] = [line for line in _lines(written.logs) if line.get("action") == "tool_raised"]
    assert raised["error_type"] == "RuntimeError" and "explode" in raised["trace"]
    assert "exc" not in raised and "error" not in raised
    assert any(line.get("action") == "model_failed" for line in _lines(written.logs))
    assert any(line.get("action") == "suspension_notice" for line in _lines(written.logs))
    for where in ("logs", "metrics", "spans"):
        assert written.marks_in(where) == set(), where


def test_with_both_settings_content_is_written(sqlite_url: str, tmp_path: Path) -> None:
    written = _serve_one_run(
        sqlite_url, tmp_path / "serve.log", TETHER_LOG_CONTENT="1", TETHER_OTEL_CONTENT="1"
    )
    assert written.marks_in("logs") | written.marks_in("spans") == set(MARKS)
    # Errors' messages, in both; what a notice shows, in the log; the conversation, in spans.
    assert {"toolerror", "modelerror", "preview", "answer"} <= written.marks_in("logs")
    assert {"toolerror", "modelerror", "question", "arguments", "result", "reason"} <= (
        written.marks_in("spans")
    )
    assert written.marks_in("metrics") == set()  # never, whatever the settings


def test_the_log_and_span_settings_are_independent(sqlite_url: str, tmp_path: Path) -> None:
    written = _serve_one_run(sqlite_url, tmp_path / "serve.log", TETHER_OTEL_CONTENT="1")
    assert written.marks_in("logs") == set()
    assert {"question", "toolerror", "modelerror"} <= written.marks_in("spans")
