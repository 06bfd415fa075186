"""Prometheus metrics (being written)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tether.engine import Engine


def render(engine: Engine) -> tuple[bytes, str]:
    """The exposition text of every metric."""
    return generate_latest(), CONTENT_TYPE_LATEST
