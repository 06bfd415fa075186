"""The ``/metrics`` exposition: tether's metrics (``tether.telemetry.metrics``, re-exported here)
plus the runs-by-state gauge, ``tether_runs_stranded`` (runs waiting on an agent version no
live worker serves, reference §12) and ``tether_worker_processes`` (a line per worker
process with a fresh heartbeat), read by the engine at scrape time, so they are true for
the whole fleet whichever process is scraped."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tether.runs import RunState
from tether.telemetry.metrics import (
    APPROVALS,
    EXPIRIES,
    MODEL_SECONDS,
    RECOVERIES,
    REGISTRY,
    STEP_SECONDS,
    TOOL_SECONDS,
)

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
    "render",
]


class _Scrape(Collector):
    """One scrape: this process's metrics plus the runs-by-state gauge counted just now."""

    def __init__(
        self,
        by_state: dict[str, int],
        stranded: int,
        waiting: dict[str, int],
        workers: list[str],
    ) -> None:
        self.by_state = by_state
        self.stranded = stranded
        self.waiting = waiting
        self.workers = workers

    def collect(self) -> Iterable[Metric]:
        return self._metrics()

    def _metrics(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        gauge = GaugeMetricFamily("tether_runs", "Runs by state, fleet-wide.", labels=["state"])
        for state, count in sorted(self.by_state.items()):
            gauge.add_metric([state], count)
        yield gauge
        yield GaugeMetricFamily(
            "tether_runs_stranded",
            "Runs waiting on an agent version no live worker serves, fleet-wide.",
            value=self.stranded,
        )
        waits = GaugeMetricFamily(
            "tether_runs_waiting",
            "Runs waiting, by why: their thread, their start time, their user's cap "
            "(fleet-wide), the model's rate limit (this process).",
            labels=["reason"],
        )
        for reason, count in sorted(self.waiting.items()):
            waits.add_metric([reason], count)
        yield waits
        processes = GaugeMetricFamily(
            "tether_worker_processes",
            "Worker processes with a fresh heartbeat, fleet-wide: 1 for each, by its worker "
            "id (host:pid:suffix).",
            labels=["worker"],
        )
        for worker in self.workers:
            processes.add_metric([worker], 1)
        yield processes


async def render(engine: Engine) -> tuple[bytes, str]:
    """The exposition text of every metric, with the runs counted by state just now."""
    # Every state is exported, zero when no run is in it, so a series never disappears.
    by_state = {state.value: 0 for state in RunState} | await engine.operator.counts_by_state()
    scrape = CollectorRegistry(auto_describe=False)
    waiting = await engine.operator.counts_waiting()
    stranded = await engine.operator.count_stranded()
    scrape.register(_Scrape(by_state, stranded, waiting, await engine.operator.live_workers()))
    return generate_latest(scrape), CONTENT_TYPE_LATEST
