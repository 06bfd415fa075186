"""Acting on a run from outside it (reference §1-§4): a halted run its owner continues with a
deliberate grant, and cancellation. Each says why running it twice is safe. Decisions on a
pending call are ``tether.approvals``; forks are ``forks.py``; moving a run to another
agent version is ``versions.py``.
"""

from __future__ import annotations

import logging
from typing import Any

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.budget import Limits, parse_limits, within_cap
from tether.errors import (
    AlreadyFinished,
    HaltedByAncestor,
    NotFound,
    NotHalted,
)
from tether.runs import Run, RunState
from tether.telemetry import tracing

log = logging.getLogger(__name__)


async def continue_run(
    services: Services,
    run_id: str,
    user: str,
    *,
    limits: Limits | dict[str, Any] | None = None,
    why: str | None = None,
) -> Run:
    """Continue a halted run, deliberately: only its owner, only when halted, with an
    explicit grant (reference §6 default, or ``limits`` within the configured cap), logged.
    In a tree (reference §18) the grant also resumes every run of its subtree its limits
    halted, and may go to a ``waiting`` parent whose limits halted some; a run halted by an
    ancestor's limits is ``halted_by_ancestor`` (naming the run to continue).

    Safe to call twice: the second call finds the run no longer halted (``not_halted``).
    """
    run = await hop(services.store.get_run, inputs.run_id(run_id))
    if run is None or run.user_id != user:
        raise NotFound("no such run")
    if why is not None:
        inputs.text(why, "why", 2000)
    if run.state is RunState.HALTED and run.halted_by not in (None, run.id):
        raise HaltedByAncestor(
            "an ancestor's limits halted this run: continue that run, which resumes this one",
            run_id=run.halted_by,
        )
    if run.state not in (RunState.HALTED, RunState.WAITING):
        raise NotHalted(f"the run is {run.state.value}, not halted")
    granted = run.limits.extended() if limits is None else parse_limits(limits, run.limits)
    within_cap(granted, services.settings.max_limits, "the granted limits")
    grant = {"tether.continue.by": user, "tether.continue.halt_reason": run.halt_reason}
    allowed = services.settings.otel_content
    why_text = {"tether.continue.why": why}
    with tracing.action(
        "continue_run", run.id, run.trace_context, grant, content=allowed, private=why_text
    ):
        continued = await hop(
            services.store.continue_halted,
            run_id=run_id,
            user_id=user,
            limits=granted,
            by=user,
            why=why,
        )
        if continued is None:
            if run.state is RunState.WAITING:
                raise NotHalted(
                    "the run is waiting for its child runs, and none of them was halted by "
                    "its limits: continue the child that halted instead"
                )
            raise NotHalted("the run is no longer halted")
    log.info("continued", extra={"run_id": run_id, "action": "continue", "state": "running"})
    return continued


async def cancel_run(services: Services, run_id: str, user: str) -> Run:
    """Cancel a run that is not terminal. Safe twice: the second call is ``already_finished``."""
    cancelled = await hop(
        services.store.cancel, run_id=inputs.run_id(run_id), user_id=user, by=user
    )
    if cancelled is not None:
        return cancelled
    run = await hop(services.store.get_run, run_id)
    if run is None or run.user_id != user:
        raise NotFound("no such run")
    raise AlreadyFinished(f"the run is already {run.state.value}")
