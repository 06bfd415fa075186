"""The ``/metrics`` exposition: tether's metrics (``tether.metrics``, re-exported here)
plus the runs-by-state gauge, counted from the store at scrape time with one grouped
SELECT, so it is true for the whole fleet whichever process is scraped."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import sqlalchemy as sa
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tether.metrics import (
    APPROVALS,
    EXPIRIES,
    MODEL_SECONDS,
    RECOVERIES,
    REGISTRY,
    STEP_SECONDS,
    TOOL_SECONDS,
)
from tether.runs import RunState
from tether.store import Store
from tether.store.schema import runs

if TYPE_CHECKING:
    from tether.engine import Engine

__all__ = [
    "APPROVALS",
    "EXPIRIES",
    "MODEL_SECONDS",
    "RECOVERIES",
    "REGISTRY",
    "STEP_SECONDS",
    "TOOL_SECONDS",
    "count_by_state",
    "render",
]

_COUNT_BY_STATE = sa.select(runs.c.state, sa.func.count()).group_by(runs.c.state)


def count_by_state(store: Store) -> dict[str, int]:
    """How many runs are in each state, every state present (zero when none)."""
    counts = {state.value: 0 for state in RunState}
    with store.engine.connect() as conn:
        for state, count in conn.execute(_COUNT_BY_STATE):
            counts[str(state)] = int(count)
    return counts


class _Scrape(Collector):
    """One scrape: this process's metrics plus the runs-by-state gauge counted just now."""

    def __init__(self, by_state: dict[str, int]) -> None:
        self.by_state = by_state

    def collect(self) -> Iterable[Metric]:
        return self._metrics()

    def _metrics(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        gauge = GaugeMetricFamily("tether_runs", "Runs by state, fleet-wide.", labels=["state"])
        for state, count in sorted(self.by_state.items()):
            gauge.add_metric([state], count)
        yield gauge


def render(engine: Engine) -> tuple[bytes, str]:
    """The exposition text of every metric (blocking: it queries the store once)."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_Scrape(count_by_state(engine.store)))
    return generate_latest(scrape), CONTENT_TYPE_LATEST
