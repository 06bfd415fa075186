"""Approvals of a call that waits on a quorum (reference §19): before the N-th, each is
recorded and answered ``recorded`` with the count; the N-th is the call's decision (the
store counts it and claims in one transaction, ``store.approvals``). An approval with an
edit starts a new round on the edited artefact, the editor's approval its first.

A person approves the artefact they saw: an approval names its digest (by default the
call's as it was read), and one whose artefact is no longer the call's is ``changed``,
nothing recorded; the same person approving the same artefact again is
``already_decided``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.approvals.request import Asked, tool_arguments
from tether.errors import Changed, InvalidInput
from tether.previews import digest as digest_of
from tether.results import ApprovalResult, CallVerdict, Choice
from tether.runs import PendingCall, Run, RunState, iso
from tether.scope import Scope

AGAIN = "you already approved this request as it is now; each person counts once"
STALE = (
    "this request changed since it was shown to you (another approver edited it, starting "
    "a new round of approvals); please review it again"
)


def applies(call: PendingCall, ask: Asked) -> bool:
    """Whether ``ask`` is an approval of a call that waits on more than one person."""
    return ask.choice is Choice.APPROVE and call.pending.quorum > 1


def stale(run: Run, call: PendingCall) -> Changed:
    """The refusal of an approval of an artefact that is no longer the call's."""
    pending = call.pending
    return Changed(
        STALE,
        diff=[],
        tool_call_id=pending.tool_call_id,
        preview=pending.preview,
        digest=pending.digest,
        expires_at=iso(run.expires_at),
    )


def seen(run: Run, call: PendingCall, ask: Asked) -> Asked:
    """``ask`` naming the artefact its approver saw: the digest they sent, which must be
    the call's (``changed`` otherwise), or the call's as it was read."""
    if ask.digest is not None and ask.digest != call.pending.digest:
        raise stale(run, call)
    return dataclasses.replace(ask, digest=call.pending.digest)


def edited(services: Services, call: PendingCall, ask: Asked) -> dict[str, Any] | None:
    """The approver's edited arguments, validated by the tool's schema (``invalid_input``),
    or None when they sent none or the pending ones."""
    if ask.arguments is None:
        return None
    edit = tool_arguments(services, call.pending, ask.arguments).model_dump(mode="json")
    return None if edit == call.pending.arguments else edit


def recorded(run: Run, ask: Asked, approvals: int, quorum: int) -> ApprovalResult:
    """The answer to an approval counted before the N-th."""
    return ApprovalResult(
        run_id=run.id,
        decision=ask.choice,
        state=RunState.SUSPENDED,
        outcome=CallVerdict.RECORDED,
        approvals=approvals,
        quorum=quorum,
    )


async def new_round(
    services: Services, run: Run, call: PendingCall, ask: Asked, edit: dict[str, Any], scope: Scope
) -> ApprovalResult:
    """Start a new round on ``edit``: its preview rendered now with the owner's ``scope``
    must be the one the editor approves (``digest``; ``invalid_input`` otherwise, nothing
    changed), then the call's artefact is replaced and the editor's approval is the first
    of its round, in one transaction (``changed`` if the call moved on meanwhile)."""
    pending = call.pending
    tool = services.agent.tool(pending.tool)
    assert tool is not None  # ``edited`` validated the arguments with it
    args = tool_arguments(services, pending, edit)
    preview = await tool.render_preview(args, scope)
    digest = digest_of(preview) if preview is not None else None
    if preview is not None and ask.digest != digest:
        raise InvalidInput(
            "an edit of a request that waits on several approvals is approved with the digest "
            "of its preview: get it with POST /v1/approvals/{token}/preview (or tether "
            "approvals preview TOKEN --arguments JSON) and send it as digest; nothing changed",
            digest=digest,
            preview=preview,
        )
    fresh = dataclasses.replace(
        pending,
        arguments=edit,
        preview=preview,
        digest=digest,
        edited_from=pending.edited_from or pending.arguments,
    )
    started = await hop(
        services.store.start_round,
        run_id=run.id,
        token_hash=call.token_hash,
        approver=ask.approver,
        seen_digest=pending.digest or "",
        call=fresh.to_json(),
        reason=ask.reason,
        event={
            "quorum": pending.quorum,
            "arguments_from": fresh.edited_from,
            "arguments_to": edit,
            "round": "new",
        },
        tool=pending.tool,
    )
    if not started:
        raise stale(run, call)
    return recorded(run, ask, 1, pending.quorum)
