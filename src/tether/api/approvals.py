"""The JSON API's approvals (reference §6, §9, §15, §19): the requests the caller may
decide, decisions by token or by run and call id, and the preview of an edit. A decision is
carried out in the request that carries it; the rest of the run goes to the workers.

An answer carries every field its engine answer sets and no other: an approval recorded
toward a quorum has its ``approvals`` and ``quorum``, a decision recorded while others of
its turn are undecided its ``waiting_for``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import Query, Request
from pydantic import BaseModel, ConfigDict, Field

from tether.api.routes import AUTH, INVALID, TOO_LARGE, Caller, EngineDep, json_router, responses
from tether.api.schemas import (
    Approvals,
    Decision,
    DecisionIn,
    DecisionsIn,
    ErrorOut,
    EscalatedAt,
    PreviewIn,
    Quorum,
    SuspendedAt,
)
from tether.runs import request_to_json

router = json_router()

# -- shapes --------------------------------------------------------------------------------


class PreviewOut(BaseModel):
    """The preview the pending call would have with the arguments, and its digest."""

    ok: Literal[True]
    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    digest: str | None


class ApprovalOut(BaseModel):
    """A decision that took effect, and where the run is now (``running``: the workers
    carry it on); ``carried``: the other calls of its turn it carried out (reference §15)."""

    model_config = ConfigDict(extra="allow")

    ok: Literal[True]
    run_id: str
    decision: Decision
    state: str
    outcome: str = Field(
        description="executed, declined, recorded (others of its turn are undecided: "
        "waiting_for says how many), released, ..."
    )
    waiting_for: int | None = Field(
        default=None, description="with outcome recorded: the calls of the turn still undecided"
    )
    approvals: int | None = Field(
        default=None,
        description="only on an approval recorded toward a quorum (outcome recorded, §19): "
        "the approvals of the call's artefact so far",
    )
    quorum: int | None = Field(
        default=None, description="with `approvals`: how many the call waits for (§19)"
    )


class DecisionOut(BaseModel):
    decision: str
    by: str
    at: str | None
    reason: str | None = None
    arguments: dict[str, Any] | None = None


class DiffOut(BaseModel):
    path: str
    before: Any
    after: Any


class ApprovalRefusedOut(ErrorOut):
    """A refused decision. ``already_resumed`` adds ``decision`` (the one that used the
    token); ``changed`` adds ``diff``, the new ``token``, ``preview`` and ``expires_at``;
    ``guard_failed`` adds ``reason``; ``wrong_version`` the run's ``agent_version``;
    ``tool_unavailable`` the halted run's ``run_id``; ``already_decided`` the ``approver``
    whose approval of this artefact is counted already (§19); ``carried`` as in
    ``ApprovalOut``."""

    decision: DecisionOut | None = None
    diff: list[DiffOut] | None = None
    token: str | None = None
    preview: dict[str, Any] | None = None
    expires_at: str | None = None
    reason: str | None = None
    agent_version: str | None = None
    run_id: str | None = None
    approver: str | None = None


class PendingApprovalOut(BaseModel):
    """A request the caller may decide: one undecided call of a suspended run's turn, from
    the stored tool call and its preview."""

    run_id: str
    user_id: str = Field(description="the run's owner")
    question: str
    tool: str
    tool_call_id: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    digest: str | None = Field(description="the digest of that preview")
    expires_at: str | None = Field(description="ISO-8601, UTC")
    pending_calls: int = Field(
        description="how many calls of the run's turn its suspension waits on (reference "
        "§15); each undecided one is listed as a request of its own"
    )
    root_run_id: str = Field(description="its tree's top-level run (its own id at the top, §18)")
    parent_run_id: str | None = Field(
        default=None, description="the run whose sub-agent call started it; null at the top"
    )
    decide_url: str = Field(
        description="where to POST a decision on it by run and call id "
        '(`{"decisions": [{"tool_call_id", "decision"}]}`); the token itself is only in '
        "the notice, never stored"
    )
    quorum: Quorum
    approvals: Approvals
    suspended_at: SuspendedAt
    escalated_at: EscalatedAt
    may_decide: bool = Field(
        description="whether the caller may decide it now: false only for the caller's own "
        'call of a four-eyes tool (`@tool(approvers="others")`), listed as waiting for '
        "someone else; true for the people a call was escalated to (§19)"
    )


class PendingApprovalListOut(BaseModel):
    """A page of the requests the caller may decide, soonest expiry first."""

    items: list[PendingApprovalOut]
    more: int = Field(description="how many more runs follow this page")
    after: str | None = Field(description="the next page's cursor, or null on the last")
    limit: int
    next: str | None = Field(description="the next page's path, or null on the last")


class CallDecisionOut(BaseModel):
    """One call's answer, as its token's endpoint would give it: a decision that took
    effect (``ok`` true, ``outcome`` executed, declined, ...), or a refusal (``ok`` false,
    ``outcome`` and ``error`` its code, with that code's fields)."""

    model_config = ConfigDict(extra="allow")

    tool_call_id: str
    ok: bool
    outcome: str
    waiting_for: int | None = Field(
        default=None, description="as on `ApprovalOut`: only on a decision recorded"
    )
    approvals: int | None = Field(
        default=None, description="as on `ApprovalOut`: only on an approval toward a quorum"
    )
    quorum: int | None = Field(default=None, description="with `approvals`")


class DecisionsOut(BaseModel):
    ok: Literal[True]
    results: list[CallDecisionOut]


# -- routes --------------------------------------------------------------------------------


@router.get(
    "/approvals",
    response_model=PendingApprovalListOut,
    tags=["approvals"],
    summary="The requests the caller may decide",
    description="Suspended runs inside their window that the caller owns or may approve "
    "(by the owner's scope now), soonest expiry first, one page of runs at a time: `limit` "
    "runs after the cursor `after`; `more` says how many runs follow, `after` is the next "
    "page's cursor and `next` its link. A run is listed once per undecided call of its "
    "turn (reference §15), with its quorum and approvals so far (§19); a call escalated "
    "to the caller is listed too. Each "
    "is decided by `POST /v1/runs/{id}/decisions` with its `tool_call_id` (the token is "
    "only ever in the notice).",
    responses=responses((401, AUTH), (422, INVALID)),
)
async def list_approvals(
    request: Request,
    user: Caller,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many")] = 100,
    after: Annotated[
        str | None, Query(description="the page after this cursor (the page before's `after`)")
    ] = None,
) -> dict[str, Any]:
    found = await engine.pending_approvals(user, after=after, limit=limit)
    base = request.app.state.public_url
    nxt = found.after
    return {
        "items": [
            {
                **request_to_json(run, call, base),
                # The tool's own rule (four eyes): the listing already holds only the calls
                # the caller may decide by the owner's scope or an escalation (§19).
                "may_decide": engine.agent.may_decide_call(call.pending.tool, run.user_id, user),
            }
            for run in found
            for call in run.suspension_calls()
            if call.decided is None
        ],
        "more": found.more,
        "after": nxt,
        "limit": limit,
        "next": None if nxt is None else f"/v1/approvals?after={nxt}&limit={limit}",
    }


@router.post(
    "/runs/{run_id}/decisions",
    response_model=DecisionsOut,
    tags=["approvals"],
    summary="Decide pending calls of a run by their ids",
    description="Decides pending calls of a suspended run, each named by its "
    "`tool_call_id`, as the caller (the same authorisation as their tokens). Every entry "
    "is checked before any is recorded. Each call's result is the answer its token would "
    "have had: the decision carried out (`outcome` executed, declined, ...) or its "
    "refusal (`ok` false, `outcome` and `error` the code, with that code's fields). A call "
    "this request carried out answers as it was carried out, never `recorded`, even when "
    "a later call of the turn was then refused; `recorded` is for a call not carried out "
    "(with `waiting_for`), or an approval counted toward a quorum (with `approvals` and "
    "`quorum`; the same person again is `already_decided` in that call's result, §19).",
    response_model_exclude_unset=True,
    responses=responses(
        (401, AUTH),
        (404, "`not_found`: no such run, or the caller may neither own nor approve it"),
        (413, TOO_LARGE),
        (
            422,
            INVALID + "; or an entry names a call twice, or a call that is neither "
            "pending nor decided on this run",
        ),
    ),
)
async def decide_calls(
    run_id: str, body: DecisionsIn, user: Caller, engine: EngineDep
) -> dict[str, Any]:
    entries = [entry.model_dump(exclude_none=True) for entry in body.decisions]
    # Shielded: a client that hangs up must not interrupt a claimed decision mid-way.
    answers = await asyncio.shield(engine.decide_calls(run_id, user, entries))
    return {"ok": True, "results": [answer.to_json() for answer in answers]}


@router.post(
    "/approvals/{token}",
    response_model=ApprovalOut,
    tags=["approvals"],
    summary="Decide a pending request",
    description="Approves or declines the request a suspended run waits on, as the "
    "caller. The decision is carried out in this request (re-checks, then the tool or "
    "the decline); the rest of the run goes to the workers. A token is used once; the "
    "token of a call that waits on a quorum takes one approval from each person until the "
    "quorum is reached, each before the last answering `recorded` with `approvals` and "
    "`quorum` (§19).",
    response_model_exclude_unset=True,
    responses={
        **responses(
            (401, AUTH),
            (
                403,
                "`no_longer_permitted`: the owner's permissions changed; the run is halted; "
                "or `four_eyes`: the tool wants someone other than the run's owner",
            ),
            (404, "`unknown_or_expired`: no such token, expired, or not the caller's to use"),
            (413, TOO_LARGE),
            (422, INVALID),
        ),
        **responses(
            (
                409,
                "`already_resumed` (with `decision`), `changed` (with `diff` and a new "
                "`token`: review again), `guard_failed` (with `reason`), `wrong_version` "
                "(with the run's `agent_version`: this process does not serve it; nothing "
                "was claimed), `tool_unavailable` (the pending tool is gone from the "
                "serving version; the run is halted `tool_unavailable`), `already_decided` "
                "(with `approver`: the caller's approval of this artefact is counted already, "
                "§19)",
            ),
            model=ApprovalRefusedOut,
        ),
    },
)
async def decide(token: str, body: DecisionIn, user: Caller, engine: EngineDep) -> dict[str, Any]:
    # Shielded: a client that hangs up must not interrupt a claimed decision mid-way.
    deciding = engine.resume_after_confirmation(
        token,
        body.decision,
        user,
        reason=body.reason,
        arguments=body.arguments,
        digest=body.digest,
    )
    result = await asyncio.shield(deciding)
    # Only what the answer sets is sent (exclude_unset), and waiting_for always (null).
    return {"waiting_for": None, **result.to_json(), "ok": True}


@router.post(
    "/approvals/{token}/preview",
    response_model=PreviewOut,
    tags=["approvals"],
    summary="Preview an edited request without deciding",
    description="Renders the preview the pending request would have with `arguments` "
    "(absent: as pending) and its digest, to send with an approval of the edit. Never "
    "claims the token and never changes anything; the same authorisation as deciding.",
    responses=responses(
        (401, AUTH),
        (404, "`unknown_or_expired`: no such token, expired, or not the caller's to use"),
        (413, TOO_LARGE),
        (422, INVALID),
    ),
)
async def preview(
    token: str, user: Caller, engine: EngineDep, body: PreviewIn | None = None
) -> dict[str, Any]:
    shown = await engine.preview_approval(token, user, body.arguments if body else None)
    return shown.to_json()
