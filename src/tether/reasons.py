"""Why a run stopped short of an answer: the stored halt and fail reasons."""

from __future__ import annotations

import enum


class HaltReason(str, enum.Enum):
    """Why a run is halted; the stored string."""

    MAX_STEPS = "max_steps"
    MAX_SPEND = "max_spend"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_ELAPSED = "max_elapsed"
    SUSPENSION_EXPIRED = "suspension_expired"
    NO_LONGER_PERMITTED = "no_longer_permitted"
    # A worker of the run's version no longer has the tool the run waits on (reference §12).
    TOOL_UNAVAILABLE = "tool_unavailable"
    # A fork of another run, stopped at the step it was forked at, until it is continued.
    FORKED = "forked"


class FailReason(str, enum.Enum):
    """Why a run failed; the stored string."""

    UNRECONCILABLE = "unreconcilable"
    RECOVERY_EXHAUSTED = "recovery_exhausted"
    ERROR = "error"  # an unexpected error in the loop; its message is in the event
    # TETHER_MAX_MODEL_ATTEMPTS consecutive model calls failed transiently (reference §10).
    MODEL_UNAVAILABLE = "model_unavailable"
    # The provider refused the request itself (a 4xx that asking again cannot fix); its
    # message is in the event.
    MODEL_ERROR = "model_error"
