"""Previews of a pending call with an approver's edited arguments (reference §9): what the
approver sees, and the digest they send with their approval. Never claims, never writes.
"""

from __future__ import annotations

from typing import Any

from tether import inputs
from tether._runtime.shared.services import Services
from tether.approvals import deciders
from tether.approvals.request import (
    checked_arguments,
    find_suspended,
    suspended_on,
    tool_arguments,
    unknown_or_expired,
)
from tether.previews import digest as digest_of
from tether.results import ApprovalPreview
from tether.runs import PendingCall, Run
from tether.tokens import hash_token


async def by_token(
    services: Services, token: str, approver: str, arguments: dict[str, Any] | None = None
) -> ApprovalPreview:
    """The preview the pending call of a token's run would have with ``arguments``
    (default: its pending arguments), rendered now with the owner's scope resolved now.
    Never claims and never writes: safe to call any number of times. The same
    authorisation as deciding (``unknown_or_expired`` or ``four_eyes`` otherwise)."""
    inputs.user_id(approver, "approver")
    if arguments is not None:
        checked_arguments(arguments)
    found = await find_suspended(services, hash_token(inputs.token(token)))
    if found.run is None or found.call is None:
        raise unknown_or_expired(found.expired, approver)
    return await _preview(services, found.run, found.call, approver, arguments)


async def by_run(
    services: Services,
    run_id: str,
    approver: str,
    *,
    tool_call_id: str,
    arguments: dict[str, Any] | None = None,
) -> ApprovalPreview:
    """``by_token`` from an inbox that knows the run and its pending call."""
    inputs.user_id(approver, "approver")
    if arguments is not None:
        checked_arguments(arguments)
    found = await suspended_on(services, run_id, tool_call_id)
    if found.run is None or found.call is None:
        raise unknown_or_expired()
    return await _preview(services, found.run, found.call, approver, arguments)


async def _preview(
    services: Services,
    run: Run,
    call: PendingCall,
    approver: str,
    arguments: dict[str, Any] | None,
) -> ApprovalPreview:
    services = services.serving(run)  # a child run's call is its sub-agent's (§18)
    scope = await services.agent.resolve_scope(run.user_id)
    await deciders.check(services, scope, call, approver)
    pending = call.pending
    args = tool_arguments(services, pending, pending.arguments if arguments is None else arguments)
    tool = services.agent.tool(pending.tool)
    assert tool is not None  # tool_arguments found it
    preview = await tool.render_preview(args, scope)
    return ApprovalPreview(
        tool=pending.tool,
        arguments=args.model_dump(mode="json"),
        preview=preview,
        digest=digest_of(preview) if preview is not None else None,
    )
