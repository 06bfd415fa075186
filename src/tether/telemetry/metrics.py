"""Prometheus metrics that any module may observe: step, model and tool durations,
recoveries, approvals and expiries, on a registry of tether's own (not the process-global
one), so two apps or test runs in one process never collide on a name.

This module imports nothing of tether's, so the loop, the resumptions and the worker can
import it without a cycle; ``tether.api.metrics`` renders it with the runs-by-state gauge.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds, from a fast tool call to a slow model turn.
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

STEP_SECONDS = Histogram(
    "tether_step_seconds",
    "Duration of one loop step: a model turn and the tool calls it asked for.",
    buckets=_BUCKETS,
    registry=REGISTRY,
)
MODEL_SECONDS = Histogram(
    "tether_model_call_seconds",
    "Duration of one model request.",
    buckets=_BUCKETS,
    registry=REGISTRY,
)
MODEL_CALLS = Counter(
    "tether_model_calls",
    "Model calls, by model (its entry in TETHER_MODEL, as written) and outcome: answered, "
    "or transient or permanent for a failure (reference §10, §21).",
    ["model", "outcome"],
    registry=REGISTRY,
)
TOOL_SECONDS = Histogram(
    "tether_tool_call_seconds",
    "Duration of one tool call, by tool.",
    ["tool"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
RECOVERIES = Counter(
    "tether_recoveries",
    "Orphaned runs taken over by a reaper, by what became of them: carried (reconciled "
    "and carried on by the worker that took it), or released, suspended, halted, "
    "answered, lease_lost, or the fail reason.",
    ["outcome"],
    registry=REGISTRY,
)
APPROVALS = Counter(
    "tether_approvals",
    "Decisions on suspended runs, by outcome: executed, declined or released when the "
    "decision took effect; the error code (already_resumed, changed, ...) when refused.",
    ["outcome"],
    registry=REGISTRY,
)
EXPIRIES = Counter(
    "tether_suspension_expiries",
    "Suspended runs halted because their approval window passed.",
    registry=REGISTRY,
)

SCHEDULE_TICKS = Counter(
    "tether_schedule_ticks",
    "Schedule ticks, by outcome: fired (a run started) or missed (skipped while no worker ran).",
    ["outcome"],
    registry=REGISTRY,
)
RATE_LIMITED_WAITS = Counter(
    "tether_rate_limited_waits",
    "Model calls that waited for the fleet's model capacity (reference §13), by the limit "
    "that held them (rpm or tpm).",
    ["limit"],
    registry=REGISTRY,
)
RATE_LIMITED_WAIT_SECONDS = Histogram(
    "tether_rate_limited_wait_seconds",
    "How long a model call that waited for the fleet's model capacity waited.",
    buckets=_BUCKETS,
    registry=REGISTRY,
)
RATE_LIMITED_RUNS = Gauge(
    "tether_rate_limited_runs",
    "Runs of this process waiting for the fleet's model capacity now.",
    registry=REGISTRY,
)
