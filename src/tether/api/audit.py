"""The JSON API's audit of decisions (reference §19): the records of the caller's runs and
those the caller made, in ``seq`` order, a page at a time. Records are never changed; the
API only reads them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import BaseModel, Field

from tether.api.routes import AUTH, INVALID, Caller, EngineDep, json_router, responses

router = json_router()

MAX_SEQ = 2**63 - 1  # the column's largest value on both backends

AuditKindOut = Literal[
    "decided", "recorded", "escalated", "continued", "migrated", "cancelled", "erased"
]


class AuditRecordOut(BaseModel):
    """One audit record. Arguments are never copied: ``digest`` binds them."""

    seq: int = Field(description="its place in the audit, increasing")
    at: str = Field(description="when, by the database's clock: ISO-8601, UTC")
    kind: AuditKindOut = Field(
        description="`decided` (a call's decision that took effect), `recorded` (an approval "
        "or decision stored before it took effect), `escalated`, `continued`, `migrated`, "
        "`cancelled`, `erased`"
    )
    run_id: str | None
    root_run_id: str | None = Field(description="its tree's top-level run (its own id at the top)")
    user_id: str | None = Field(description="the run's owner")
    by: str | None = Field(description="who did it (null for the engine's own escalation)")
    tool: str | None
    tool_call_id: str | None
    digest: str | None = Field(description="the digest of the artefact decided")
    decision: str | None = Field(description="approve or decline, on a decision")
    reason: str | None
    outcome: str | None = Field(
        description="what it came to: approved, declined, edited, recorded, resumed, ..."
    )


class AuditPageOut(BaseModel):
    """A page of the caller's audit records, in ``seq`` order."""

    items: list[AuditRecordOut] = Field(description="the records, in `seq` order")
    more: bool = Field(description="whether more records follow this page")
    after: int | None = Field(description="the next page's cursor (its last seq), or null")
    limit: int
    next: str | None = Field(description="the next page's path, or null on the last")


@router.get(
    "/audit",
    response_model=AuditPageOut,
    tags=["audit"],
    summary="The audit of the caller's decisions",
    description="The audit records of the runs the caller owns and those whose `by` is the "
    "caller (decisions, recorded approvals, escalations, continuations, migrations, "
    "cancellations), in `seq` order: `limit` records after the seq `after`; `more` says "
    "whether more follow, `after` is the next page's cursor and `next` its link. Records "
    "outlive their runs (`TETHER_AUDIT_RETENTION_DAYS`) and are never changed.",
    responses=responses((401, AUTH), (422, INVALID)),
)
async def list_audit(
    user: Caller,
    engine: EngineDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="the seq to start after (0: the first)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many")] = 100,
) -> dict[str, Any]:
    page = await engine.audit(user, after=after, limit=limit)
    nxt = page.after
    return {
        "items": [record.to_json() for record in page],
        "more": page.more,
        "after": nxt,
        "limit": limit,
        "next": None if nxt is None else f"/v1/audit?after={nxt}&limit={limit}",
    }
