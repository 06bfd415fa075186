"""The JSON API's schedules (reference §13): the caller's cron schedules, added, listed
and deleted; each tick starts one run of the caller, fleet-wide."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field

from tether.api.routes import AUTH, INVALID, TOO_LARGE, Caller, EngineDep, json_router, responses
from tether.api.schemas import Question
from tether.budget import LimitsInput
from tether.runs import iso

router = json_router()


class ScheduleIn(BaseModel):
    """A schedule (§13): each tick of ``cron`` starts a run of the caller asking ``question``."""

    model_config = ConfigDict(extra="forbid")

    cron: str = Field(
        max_length=255,
        description="five fields (minute hour day-of-month month day-of-week) or @hourly, "
        "@daily, @weekly, @monthly",
    )
    question: Question
    limits: LimitsInput | None = None
    timezone: str = Field(
        default="UTC", max_length=64, description="an IANA timezone name, such as Europe/Paris"
    )


class ScheduleCreatedOut(BaseModel):
    id: str
    next_at: str = Field(description="the first tick, ISO-8601, UTC")


class ScheduleOut(BaseModel):
    """A schedule (§13) with its next tick and what it fired."""

    id: str
    user_id: str
    cron: str
    timezone: str
    question: str
    limits: dict[str, Any] | None
    next_at: str = Field(description="ISO-8601, UTC")
    created_at: str = Field(description="ISO-8601, UTC")
    last_fired_at: str | None = Field(description="ISO-8601, UTC, or null before the first tick")
    fired: int = Field(description="ticks that started a run")
    missed: int = Field(description="ticks that passed while no worker ran (no run of their own)")


class ScheduleListOut(BaseModel):
    items: list[ScheduleOut]


@router.post(
    "/schedules",
    status_code=201,
    response_model=ScheduleCreatedOut,
    tags=["schedules"],
    summary="Add a schedule",
    description="Each tick of `cron`, in `timezone` (default UTC), starts one run of the "
    "caller asking `question`, however many workers run; ticks missed while no worker ran "
    "start one run when a worker comes back.",
    responses=responses(
        (401, AUTH),
        (413, TOO_LARGE),
        (422, INVALID + "; or the cron expression, the timezone or a limit is not valid"),
    ),
)
async def add_schedule(body: ScheduleIn, user: Caller, engine: EngineDep) -> dict[str, Any]:
    limits = body.limits.model_dump(exclude_none=True) if body.limits is not None else None
    added = await engine.add_schedule(
        user, body.cron, body.question, limits=limits, timezone_name=body.timezone
    )
    return {"id": added.id, "next_at": iso(added.next_at)}


@router.get(
    "/schedules",
    response_model=ScheduleListOut,
    tags=["schedules"],
    summary="The caller's schedules",
    responses=responses((401, AUTH)),
)
async def list_schedules(user: Caller, engine: EngineDep) -> dict[str, Any]:
    return {"items": [s.to_json() for s in await engine.list_schedules(user)]}


@router.delete(
    "/schedules/{schedule_id}",
    status_code=204,
    tags=["schedules"],
    summary="Delete a schedule (its runs stay)",
    responses=responses(
        (401, AUTH), (404, "`not_found`: no such schedule, or not the caller's"), (422, INVALID)
    ),
)
async def delete_schedule(schedule_id: str, user: Caller, engine: EngineDep) -> Response:
    await engine.delete_schedule(schedule_id, user=user)
    return Response(status_code=204)
