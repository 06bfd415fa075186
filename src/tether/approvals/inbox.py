"""What an inbox shows a person: who may decide a run's pending call, the requests a
viewer may decide, and what an approval token names now. Nothing here changes anything."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from tether import inputs
from tether._runtime.fleet import escalations
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.approvals import deciders
from tether.approvals.request import suspended_on
from tether.errors import InvalidInput, UnknownOrExpired
from tether.results import Inbox, TokenLookup
from tether.runs import PendingCall, Run, RunState
from tether.scope import GROUP, Scope, names
from tether.tokens import hash_token

log = logging.getLogger(__name__)


async def may_decide(
    services: Services,
    owner: str,
    viewer: str,
    *,
    tool: str | None = None,
    call: PendingCall | None = None,
) -> bool:
    """Whether ``viewer`` may decide ``owner``'s pending calls, by the owner's scope now
    (and the viewer's, when it names groups; ``call``: a call escalated to the viewer,
    reference §19); with ``tool``, a call of that tool, whose rule may want someone other
    than the owner (four eyes; ``deciders.check`` is the same check). Without ``tool`` it
    says who may see the requests (the owner sees their four-eyes requests waiting on
    someone else). A scope that cannot be resolved is an error, never a quiet "no"."""
    if tool is not None and not services.agent.may_decide_call(tool, owner, viewer):
        return False
    if owner == viewer:
        return True
    scope = await deciders.resolved(services, owner)
    escalated = deciders.escalated_to(services, call)
    return await deciders.allowed(services, scope, viewer, escalated=escalated)


async def _escalated_to(services: Services, viewer: str, known: set[str]) -> dict[str, set[str]]:
    """Owners (not in ``known``) with escalated calls that name ``viewer``, and those
    calls' tools: the viewer sees only those of their requests (reference §19)."""
    found: dict[str, set[str]] = {}
    groups: frozenset[str] | None = None
    for owner, name in await hop(services.store.escalated_requests):
        to = escalations.escalate_to(services, name)
        if owner in known or not to:
            continue
        if groups is None and any(n.startswith(GROUP) for n in to):
            groups = (await deciders.resolved(services, viewer)).groups
        if names(to, viewer, groups or ()):
            found.setdefault(owner, set()).add(name)
    return found


def _only_escalated(runs: list[Run], escalated: dict[str, set[str]]) -> list[Run]:
    """``runs`` with, for an owner the viewer sees only through escalations, only their
    escalated calls of the named tools (a run left with none is dropped)."""
    out = []
    for run in runs:
        if run.user_id not in escalated:
            out.append(run)
            continue
        tools = escalated[run.user_id]
        calls = tuple(
            c for c in run.pending_calls if c.escalated_at is not None and c.pending.tool in tools
        )
        if calls:
            out.append(dataclasses.replace(run, pending_calls=calls))
    return out


async def pending_approvals(
    services: Services, viewer: str | None, *, after: str | None = None, limit: int = 100
) -> Inbox:
    """A page of the suspended runs inside their window that ``viewer`` owns or may
    approve (every one when ``viewer`` is None: the operator's view), soonest expiry
    first, after the cursor ``after``, and how many more follow. Filtered by the viewer
    in the query, so nobody's
    many requests hide another's: the owners with open suspensions are read first, the
    ones the viewer may decide are resolved from each owner's scope now, and only their
    runs are paged."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidInput("limit must be between 1 and 1000")
    cursor = inputs.requests_cursor(after) if after is not None else None
    owners = None
    escalated: dict[str, set[str]] = {}
    if viewer is not None:
        everyone, _ = await hop(services.store.open_suspension_owners)
        owners = [owner for owner in everyone if await may_decide(services, owner, viewer)]
        escalated = await _escalated_to(services, viewer, set(owners))
        owners += sorted(escalated)
    runs, more, now = await hop(services.store.open_suspensions, limit, owners=owners, after=cursor)
    return Inbox(runs=_only_escalated(runs, escalated), now=now, more=more)


async def approval_request(services: Services, token: str, approver: str) -> TokenLookup:
    """What an approval token names now, as ``approver`` may see it: the suspended run, or
    the decision that used the token and its run, each only if ``approver`` may decide
    that run (else nothing: a request is never revealed to someone who may not decide);
    to the owner of a run whose suspension on it expired, that run (``expired``)."""
    found = await hop(services.store.match_token, hash_token(inputs.token(token)))
    run, used, expired = found.run, found.decision, found.expired
    decided = await hop(services.store.get_run, used.run_id) if used is not None else None
    now = await hop(services.store.now)
    if expired is not None and expired.user_id != approver:
        expired = None  # only its owner learns that a run expired (and may continue it)
    if run is not None and (
        run.state is not RunState.SUSPENDED
        or not await may_decide(services, run.user_id, approver, call=found.call)
    ):
        run = None
    if decided is not None and not await may_decide(services, decided.user_id, approver):
        used = decided = None
    if run is not None and found.call is not None and _counts_people(found.call):
        run = await _with_calls(services, run)
    call = found.call.pending if run is not None and found.call is not None else None
    return TokenLookup(run=run, used=used, decided_run=decided, now=now, expired=expired, call=call)


async def request_of_run(
    services: Services, run_id: str, tool_call_id: str, approver: str
) -> Run | None:
    """The run when it is suspended on ``tool_call_id`` and ``approver`` may decide it."""
    try:
        found = await suspended_on(services, run_id, tool_call_id)
    except UnknownOrExpired:  # not a call id at all
        return None
    run = found.run
    if run is None or not await may_decide(services, run.user_id, approver, call=found.call):
        return None
    return await hop(services.store.get_run, run.id)  # with every call it waits on


async def token_owner(services: Services, token: str) -> str | None:
    """The user whose run a token belongs to (pending or used), for the operator's CLI."""
    found = await hop(services.store.match_token, hash_token(inputs.token(token)))
    run, used = found.run or found.expired, found.decision
    if run is not None:
        return run.user_id
    decided = await hop(services.store.get_run, used.run_id) if used is not None else None
    return decided.user_id if decided is not None else None


def _counts_people(call: PendingCall) -> bool:
    """Whether a page shows who decides ``call``: it waits on a quorum, or was escalated."""
    return call.pending.quorum > 1 or call.escalated_at is not None


async def _with_calls(services: Services, run: Run) -> Run:
    """``run`` read again with every call of its suspension and their approvals so far
    (a token's read has neither), while it is still on the same suspension."""
    again = await hop(services.store.get_run, run.id)
    if again is None or again.lease_epoch != run.lease_epoch:
        return run  # moved on meanwhile: the page finds its call decided
    return again


async def still_approving(
    services: Services, runs: Sequence[Run]
) -> dict[tuple[str, str], tuple[str, ...]]:
    """Who may still approve each undecided call of ``runs`` that waits on a quorum or was
    escalated (reference §19), by run id and tool call id: the owner (unless the call's
    tool wants someone else), the people and groups (``group:NAME``) the owner's scope
    names now and, once the call was escalated, those its tool's ``escalate_to`` names;
    not the people who approved its current artefact. Each scope is resolved once; one
    that cannot be resolved is an error (``deciders.resolved``)."""
    scopes: dict[tuple[str, str], Scope] = {}
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    for run in runs:
        serving = services.serving(run)  # a child's call is its sub-agent's (§18)
        for call in run.suspension_calls():
            if call.decided is not None or not _counts_people(call):
                continue
            key = (run.agent_version, run.user_id)
            if key not in scopes:
                scopes[key] = await deciders.resolved(serving, run.user_id)
            mine = serving.agent.may_decide_call(call.pending.tool, run.user_id, run.user_id)
            approvers = sorted(scopes[key].approvers, key=lambda n: (n.startswith(GROUP), n))
            owner = [run.user_id] if mine else []
            named = [*owner, *approvers, *deciders.escalated_to(serving, call)]
            approved = {str(a.get("by")) for a in call.approvals}
            who = tuple(n for n in dict.fromkeys(named) if n not in approved)
            found[(run.id, call.pending.tool_call_id)] = who
    return found
