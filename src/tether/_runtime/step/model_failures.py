"""A model that is down (reference §10): what a failed model call does to its run.

A transient failure (a timeout, a connection error, 408, 409, 429, 5xx) hands the run
back to the workers with a delay, exponential from ``model_retry_first_s`` to
``model_retry_max_s``; the run holds no lease while it waits, and whichever worker claims
it next asks the model again from the stored messages. The ``max_model_attempts``-th
consecutive failure fails it ``model_unavailable``; a permanent error (any other 4xx)
fails it ``model_error`` at once. The count lives in ``runs.model_failures``: a stored turn
resets it, so only consecutive failures add up.
"""

from __future__ import annotations

import logging
import random

from tether._runtime.step.session import RunSession
from tether.config import Settings
from tether.errors import ModelError
from tether.reasons import FailReason
from tether.results import Outcome, StopKind
from tether.runs import iso
from tether.telemetry.content import fields

log = logging.getLogger(__name__)

# The event keeps the start of a provider's message: enough to read, bounded in size.
MAX_MESSAGE_CHARS = 2000


def backoff_s(attempt: int, settings: Settings) -> float:
    """The delay after the ``attempt``-th consecutive failure: the first delay, doubled
    each time, capped; plus up to a tenth as jitter, so the runs one outage failed do not
    all come back at the same instant."""
    base = settings.model_retry_first_s * 2.0 ** min(attempt - 1, 32)
    return min(settings.model_retry_max_s, base * (1 + random.random() / 10))


async def model_failed(session: RunSession, error: ModelError, failures: int) -> Outcome:
    """Hand the run back with a delay, or fail it, after its model call raised ``error``;
    ``failures`` counts the consecutive failed calls before this one.

    Safe to run twice, and the retry itself is safe: nothing of the failed call was
    stored (no message, no spend, no step), so the next owner asks again from exactly the
    messages this one sent; and each write is fenced by the lease, so an owner that lost
    the run changes nothing."""
    settings = session.services.settings
    attempt = failures + 1
    event: dict[str, object] = {"error": error.message[:MAX_MESSAGE_CHARS]}
    if error.status is not None:
        event["status"] = error.status
    extra = {
        "run_id": session.run.id,
        "action": "model_failed",
        "attempt": attempt,
        "status": error.status,
        **fields(settings.log_content, error=error.message),
    }
    if not error.transient:
        log.warning("model error", extra={**extra, "state": FailReason.MODEL_ERROR.value})
        return await session.fail(FailReason.MODEL_ERROR, event)
    if attempt >= settings.max_model_attempts:
        log.warning("model unavailable", extra={**extra, "state": "model_unavailable"})
        return await session.fail(FailReason.MODEL_UNAVAILABLE, {**event, "attempts": attempt})
    delay = backoff_s(attempt, settings)
    attempt, ready_at = await session.retry_model(delay, event)
    log.warning("model retry", extra={**extra, "attempt": attempt, "retry_at": iso(ready_at)})
    return Outcome(
        run_id=session.run.id, kind=StopKind.RELEASED, reason="model_retry", retry_in_s=delay
    )
