"""The JSON API's threads (reference §14): the caller's conversations, read whole or
listed, and deleted with everything of their runs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Response

from tether.api.routes import AUTH, INVALID, Caller, EngineDep, json_router, responses
from tether.api.schemas import ThreadDetailOut, ThreadListOut

router = json_router()

_NO_THREAD = "`not_found`: no such thread, or not the caller's"


@router.get(
    "/threads",
    response_model=ThreadListOut,
    tags=["threads"],
    summary="The caller's threads",
    description="Most recently active first, each with its runs, without the conversation.",
    responses=responses((401, AUTH), (422, INVALID)),
)
async def list_threads(
    user: Caller,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many")] = 100,
) -> dict[str, Any]:
    return {"items": [t.to_json() for t in await engine.list_threads(user, limit)]}


@router.get(
    "/threads/{thread_id}",
    response_model=ThreadDetailOut,
    tags=["threads"],
    summary="A thread with its whole conversation",
    responses=responses((401, AUTH), (404, _NO_THREAD), (422, INVALID)),
)
async def get_thread(thread_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    return (await engine.get_thread(thread_id, user=user)).to_json()


@router.delete(
    "/threads/{thread_id}",
    status_code=204,
    tags=["threads"],
    summary="Delete a thread and everything of its runs",
    responses=responses(
        (401, AUTH),
        (404, _NO_THREAD),
        (409, "`thread_busy`: a run of it is running, suspended, waiting or queued (`run_id`)"),
        (422, INVALID),
    ),
)
async def delete_thread(thread_id: str, user: Caller, engine: EngineDep) -> Response:
    await engine.delete_thread(thread_id, user=user)
    return Response(status_code=204)
