"""A run's side of the fleet's model rate (reference §13): every model request of a run
(the step's call in ``loop.py``, a compaction's summary in ``compaction.py``) starts with
``model_capacity`` and reports its usage with ``model_ended``.

Capacity is asked for and counted as the run's user's, so the fleet gives it to waiting
users in turn (``shared/model_rate_limiter.py``). A run that must wait keeps its lease (the
heartbeat goes on beating for it), counts no model failure, and does not count the wait as
active time (``elapsed_ms``); its wait shows as one ``rate_limited`` event in the step
(``store.note_rate_limited``).
"""

from __future__ import annotations

import logging

from tether._runtime.hop import hop
from tether._runtime.step.session import RunSession
from tether.failpoints import fail
from tether.models.base import Usage

log = logging.getLogger(__name__)


async def model_capacity(session: RunSession) -> bool:
    """Wait for the fleet's capacity for one model request of ``session``'s run; False
    when the worker began stopping meanwhile (the caller hands the run back). Raises
    ``LeaseLost`` when the run was taken over while it waited. No limit set: True at once,
    without a store call."""
    limiter = session.services.limiter
    if not limiter.enabled:
        return True
    run_id = session.run.id

    async def on_wait(limit: str, wait_s: float) -> None:
        data = {"limit": limit, "wait_s": round(wait_s, 3), "step": session.step + 1}
        log.info("rate limited", extra={"run_id": run_id, "action": "rate_limited", **data})
        await hop(session.services.store.note_rate_limited, session.lease, data)

    granted, waited_s = await limiter.acquire(
        session.run.user_id,
        on_wait=on_wait,
        check=session.check_held,
        stopping=lambda: session.stopping,
    )
    session.idle(waited_s)
    if not granted:
        return False
    fail("after_rate_lease")
    return True


def model_ended(session: RunSession, usage: Usage) -> None:
    """Report a model request's input and output tokens to the fleet's TPM, as its run's
    user's."""
    tokens = usage.input_tokens + usage.output_tokens
    session.services.limiter.report(session.run.user_id, tokens)
