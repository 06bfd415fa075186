"""Creating a run (reference §14): validated input, the user's scope resolved now, and,
with an ``Idempotency-Key``, the key stored with the run in one transaction
(``tether.store.creation``), so a repeat answers the first request and creates nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step.first_messages import first_messages
from tether.budget import Limits, parse_limits, within_cap
from tether.errors import IdempotencyMismatch
from tether.previews import digest as json_digest
from tether.results import Accepted
from tether.store.creation import ACCEPTED
from tether.store.records import RunRequest
from tether.telemetry import tracing


async def start_run(
    services: Services,
    user: str,
    question: str,
    *,
    limits: Limits | dict[str, Any] | None,
    route: dict[str, Any] | None,
    thread_id: str | None,
    if_busy: str,
    idempotency_key: str | None,
    body: Any,
    priority: int | None = None,
    start_at: Any = None,
) -> Accepted:
    """Create a run for ``user`` (see ``Engine.start_run``). With ``idempotency_key`` the
    request is ``body`` (by default these arguments): a key ``user`` used before answers
    its first request's answer and creates nothing when ``body`` is the same parsed
    JSON, else ``idempotency_mismatch``.

    Safe to repeat with a key: the key is the first write of the transaction that would
    create the run (``tether.store.creation``), so concurrent repeats and a retry after a
    lost answer or a COMMIT cut off get the first answer. A repeat costs what a fresh
    request does up to that write (its scope is resolved again), so a fresh key costs
    one INSERT more than no key."""
    inputs.user_id(user)
    inputs.text(question, "question", inputs.MAX_QUESTION_CHARS)
    enqueue = inputs.if_busy(if_busy)
    given_priority = None if priority is None else inputs.priority(priority)
    order = {"priority": given_priority, "start_at": inputs.start_at(start_at)}
    if thread_id is not None:
        thread_id = inputs.thread_id(thread_id)
    run_limits = parse_limits(limits, services.settings.default_limits)
    within_cap(run_limits, services.settings.max_limits, "the requested limits")
    request = None
    if idempotency_key is not None:
        if body is None:
            given = limits.to_json() if isinstance(limits, Limits) else limits
            body = {"question": question, "limits": given, "thread_id": thread_id}
            body["if_busy"] = if_busy
            # Named only when given, so a digest from before priority and start_at still matches.
            body.update({name: value for name, value in order.items() if value})
        request = (inputs.idempotency_key(idempotency_key), json_digest(body))
    agent, allowed = services.agent, services.settings.otel_content
    scope = await agent.resolve_scope(user)
    run_id = uuid.uuid4().hex
    with tracing.run_created(run_id, user, agent.name, content=allowed) as span:
        fields: dict[str, Any] = {
            "run_id": run_id,
            "user_id": user,
            "question": question,
            "route": route or {"agent": agent.name},
            "limits": run_limits,
            "scope": scope.to_json(),
            "versions": agent.versions(),
            "agent_version": agent.agent_version,
            "messages": first_messages(agent, question, follow_up=thread_id is not None),
            "trace_context": span.carrier(),  # the run's later spans continue this trace
            "thread_id": thread_id,  # None: a new thread, of the run's id
            "follow_up": thread_id is not None,
            "enqueue": enqueue,
            # Checked against the user's bound where the run is written (``users.admit``).
            "priority_bound": services.settings.max_priority,
            **order,
        }
        if request is None:
            run = await hop(services.store.create_run, **fields)
            return Accepted(run=run, status=ACCEPTED, body={"id": run.id, "state": run.state.value})
        key, digest = request
        stored = await hop(services.store.create_requested_run, key=key, digest=digest, **fields)
        return _answer(stored, digest)


def _answer(request: RunRequest, digest: str) -> Accepted:
    """The answer stored for a request, when this one has the same body."""
    if request.digest != digest:
        raise IdempotencyMismatch(
            "this Idempotency-Key was used for a request with another body; use a new key "
            "for a new request"
        )
    return Accepted(run=request.run, status=request.status, body=request.response)
