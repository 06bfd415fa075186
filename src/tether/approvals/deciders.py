"""Who may decide a pending call (reference §19): the one check, for deciding, previewing,
listing and seeing a request.

An approver may decide a call of ``owner``'s run when the owner's scope, resolved now,
names them or a group their own scope, resolved now, lists (invariant 7 applies to both
people); when the call was escalated, also when its tool's ``escalate_to`` names them or
one of their groups. The tool's own rule comes on top: with ``approvers="others"`` the
owner never decides (``four_eyes``). The approver's scope is resolved only when a group
is named, so a setup without groups resolves one scope per decision, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tether._runtime.fleet import escalations
from tether._runtime.shared.services import Services
from tether.approvals.request import unknown_or_expired
from tether.errors import FourEyes, ScopeUnavailable, TetherError
from tether.runs import PendingCall
from tether.scope import GROUP, Scope, names

log = logging.getLogger(__name__)


def escalated_to(services: Services, call: PendingCall | None) -> tuple[str, ...]:
    """Who ``call`` was escalated to (its tool's ``escalate_to``), or nobody when it was
    not escalated (or its tool is not served here)."""
    if call is None or call.escalated_at is None:
        return ()
    return escalations.escalate_to(services, call.pending.tool)


async def resolved(services: Services, user_id: str) -> Scope:
    """``user_id``'s scope now. A resolver that fails is an error (its own code, else
    ``scope_unavailable``), never a quiet "no", which would hide requests from everyone."""
    try:
        return await services.agent.resolve_scope(user_id)
    except Exception as exc:
        log.warning(
            "scope unavailable",
            extra={"action": "scope", "user": user_id, "error": type(exc).__name__},
        )
        if isinstance(exc, TetherError):  # the resolver's own code (the demo's CRM's)
            raise
        raise ScopeUnavailable(
            "a scope could not be resolved, so who may decide this request is not known; "
            "try again later"
        ) from exc


async def allowed(
    services: Services, scope: Scope, approver: str, *, escalated: Sequence[str] = ()
) -> bool:
    """Whether ``approver`` may decide calls of ``scope``'s user, by that scope resolved now
    (and the people and groups a call was ``escalated`` to); the approver's own scope is
    resolved only when a group is named."""
    if scope.may_approve(approver) or approver in escalated:
        return True
    if not scope.names_groups and not any(n.startswith(GROUP) for n in escalated):
        return False
    groups = (await resolved(services, approver)).groups
    return scope.may_approve(approver, groups) or names(escalated, approver, groups)


async def check(services: Services, scope: Scope, call: PendingCall, approver: str) -> None:
    """The one check of who may decide (or preview an edit of) ``call`` of ``scope``'s
    user, before anything is claimed: ``unknown_or_expired`` for someone who may not
    (nobody learns that the run exists), ``four_eyes`` for the owner when the call's tool
    wants someone else (the owner knows the run)."""
    if not await allowed(services, scope, approver, escalated=escalated_to(services, call)):
        raise unknown_or_expired()
    if not services.agent.may_decide_call(call.pending.tool, scope.user_id, approver):
        raise FourEyes(
            f"a call of {call.pending.tool} needs the decision of someone other than the "
            f"run's owner: one of the approvers {scope.user_id}'s scope names",
            tool=call.pending.tool,
        )
