"""Forking a run at a step (reference §12): a new run with the parent's messages through step K,
halted (``forked``) until its owner continues it, with the parent's limits and nothing
consumed. Nothing of the parent is re-executed: every call through step K has its
result in the copied messages, and the fork's ledger starts empty.

Steps count model turns (assistant messages) from 1; "through step K" is every message
before the (K+1)-th assistant message, or all of them when there is none.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from tether import inputs
from tether._runtime.hop import hop
from tether.errors import InvalidInput
from tether.messages import step_boundary
from tether.runs import Run
from tether.telemetry import tracing

if TYPE_CHECKING:
    from tether._runtime.shared.services import Services

log = logging.getLogger(__name__)


async def fork_run(
    services: Services, run_id: str, user: str, *, at_step: object, dry_run: bool
) -> Run:
    """Fork ``user``'s run ``run_id`` through step ``at_step`` into a new halted run.

    ``not_found`` if the run is missing or not ``user``'s; ``invalid_input`` for a running
    run, a step that is not a boundary, or a run whose limits (the fork's) are over the
    configured cap. Each call makes a new fork (forks are cheap and nothing runs until one
    is continued), so a repeated request is a second fork.
    """
    if not isinstance(dry_run, bool):
        raise InvalidInput("dry_run must be true or false")
    new_id = uuid.uuid4().hex
    # The fork is a run of its own: its own trace, as a run that was asked.
    allowed = services.settings.otel_content
    with tracing.run_created(new_id, user, services.agent.name, content=allowed) as span:
        fork = await hop(
            services.store.fork_run,
            run_id=inputs.run_id(run_id),
            user_id=user,
            new_id=new_id,
            at_step=at_step,
            dry_run=dry_run,
            by=user,
            boundary=step_boundary,
            cap=services.settings.max_limits,
            trace_context=span.carrier(),
        )
    log.info(
        "forked",
        extra={"run_id": fork.id, "action": "fork", "state": fork.state.value},
    )
    return fork


async def forks_of(services: Services, run_id: str) -> list[Run]:
    """The runs forked from ``run_id``, oldest first."""
    return list(await hop(services.store.forks_of, inputs.run_id(run_id)))
