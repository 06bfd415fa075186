"""A real OTLP/HTTP trace receiver for the tests, and the agent its crash test runs.

No OpenTelemetry Collector or Jaeger build installs from the registries this project
reaches (Debian has only client libraries; PyPI and npm none), so the receiver is ours:
an HTTP server that takes ``POST /v1/traces`` as the SDK's OTLP/HTTP exporter sends it
(protobuf, gzip or not), decodes it with ``opentelemetry-proto`` and answers an
``ExportTraceServiceResponse``. ``GET /spans`` lists what it received as JSON, so a test
subprocess can wait for its own spans to have arrived; ``raw()`` is every request's body as
it came (decompressed), for a test that scans all of it (events and statuses included).

``agent`` (``--agent otlp:agent``) is the test agent with one more read,
``await_export``, that returns once this process's first spans reached the receiver:
what the crash test needs before killing the process, since a hard crash loses the spans
its batch processor had not exported yet.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import agents
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from waiting import poll_until

from tether import Agent, ScriptedModel, tool

# The resource attribute that tells the test's processes apart.
PROCESS_ATTR = "test.process"


@dataclass(frozen=True, kw_only=True)
class ReceivedSpan:
    """One span as the receiver decoded it."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "attributes": self.attributes,
            "resource": self.resource,
        }


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one OTLP/HTTP protobuf export request."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        resource=resource,
                    )
                )
    return spans


class Receiver:
    """An OTLP/HTTP trace receiver on a free local port (``url`` is its endpoint base)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.bodies.append(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:
                body = json.dumps([s.to_json() for s in receiver.received()]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def raw(self) -> bytes:
        """Every export request's body received so far, one after another."""
        with self._lock:
            return b"".join(self.bodies)

    def of_process(self, process: str) -> list[ReceivedSpan]:
        return [s for s in self.received() if s.resource.get(PROCESS_ATTR) == process]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


# -- the crash test's agent ------------------------------------------------------------------


def _own_spans_arrived() -> bool:
    endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    me = os.environ["OTLP_TEST_PROCESS"]
    with urllib.request.urlopen(f"{endpoint}/spans", timeout=5) as answer:
        spans = json.loads(answer.read())
    return any(s["resource"].get(PROCESS_ATTR) == me for s in spans)


@tool
def await_export() -> dict[str, Any]:
    """A read that returns once this process's first spans reached the receiver."""
    poll_until(_own_spans_arrived, timeout=30, what="this process's spans at the receiver")
    return {"exported": True}


SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [agents.call("await_export")]},
    {"tool_calls": [agents.call("record", item="a")]},
    {"content": "done"},
]


def agent() -> Agent:
    """The test agent with ``await_export``, playing ``SCRIPT``."""
    return Agent(
        name="otlp",
        system_prompt="You are a test agent.",
        tools=(agents.lookup, agents.record, await_export),
        resolve_scope=agents.resolve,
        default_model=lambda: ScriptedModel(SCRIPT),
    )
