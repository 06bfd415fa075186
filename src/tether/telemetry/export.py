"""Exporting spans from tether's own processes (reference §11): a ``tether`` command whose
environment names an OTLP endpoint sends its spans there over OTLP/HTTP. The spans
themselves are made in ``tracing.py``; an application that embeds the engine configures
its own tracer provider and never uses this."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
FLUSH_MS = 5000


@contextmanager
def exporting() -> Iterator[None]:
    """For a ``tether`` command: with the extra installed and an OTLP endpoint in the
    environment (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``,
    read by the exporter with the other ``OTEL_*`` variables), export spans over OTLP/HTTP
    through a ``BatchSpanProcessor``, and flush them on the way out (for at most
    ``FLUSH_MS``). A hard crash loses the spans not yet exported. Otherwise nothing."""
    if not any(os.environ.get(var) for var in ENDPOINT_VARS):
        yield
        return
    try:
        from opentelemetry import trace
    except ImportError:  # without the extra: nothing to export
        yield
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTLP endpoint set but the otel extra is incomplete", extra={"action": "otel"})
        yield
        return
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        yield  # the agent's module configured tracing itself: its provider is used
        return
    name = os.environ.get("OTEL_SERVICE_NAME") or "tether"
    provider = SdkProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    # The global provider, so that spans of the agent's own libraries join the same trace.
    trace.set_tracer_provider(provider)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # an exporter that fails never fails the command
            provider.force_flush(FLUSH_MS)
            provider.shutdown()
