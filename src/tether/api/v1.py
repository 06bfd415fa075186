"""The JSON API under /v1 (reference §6): runs and their traces, continuation, cancellation
and forks, for the caller of ``Authorization: Bearer API_KEY`` (approvals are in
``approvals.py``).

Refusals are the engine's errors (reference §4), rendered by the app's handler as a 4xx
``{"ok": false, "error": CODE, "message": TEXT}``; a run that is missing or another
user's is one and the same ``not_found``. Input is validated before anything is stored.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Header, Query, Request, Response
from sse_starlette import EventSourceResponse

from tether import inputs
from tether.api.deps import stream_slots_of
from tether.api.routes import AUTH, INVALID, TOO_LARGE, Caller, EngineDep, json_router, responses
from tether.api.schemas import (
    AcceptedOut,
    ContinueIn,
    EventListOut,
    ForkIn,
    RunDetailOut,
    RunListOut,
    RunOut,
    StartRunIn,
)
from tether.api.stream import event_stream
from tether.api.stream_slots import as_json
from tether.engine import Engine
from tether.runs import iso, run_to_json

router = json_router()

_NOT_FOUND = "`not_found`: no such run, or not the caller's"


# -- runs ----------------------------------------------------------------------------------


@router.post(
    "/runs",
    status_code=202,
    response_model=AcceptedOut,
    tags=["runs"],
    summary="Start a run",
    description="Creates a run for the caller; it waits for a worker, which carries it to "
    "its next stop. Poll `GET /v1/runs/{id}`. Each limit is at most the configured cap "
    "(`TETHER_MAX_LIMITS`). With `thread_id` it is a follow-up in that thread (§14). With "
    "an `Idempotency-Key` a repeat of the same body answers the first request's answer "
    "and creates nothing (§14).",
    responses=responses(
        (401, AUTH),
        (404, "`not_found`: the thread is missing or not the caller's"),
        (
            409,
            "`thread_busy`: a run of the thread is going (`run_id`); or "
            "`idempotency_mismatch`: the key was used with another body; nothing was created",
        ),
        (413, TOO_LARGE),
        (
            422,
            INVALID + "; or a limit is over the cap (`limit` and `cap` say which); or the "
            "`Idempotency-Key` is not 1-255 printable ASCII characters",
        ),
    ),
)
async def start_run(
    body: StartRunIn,
    user: Caller,
    engine: EngineDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="1-255 printable ASCII characters; a repeat with the same body "
            "answers the first request's answer and creates nothing",
        ),
    ] = None,
) -> dict[str, Any]:
    limits = body.limits.model_dump(exclude_none=True) if body.limits is not None else None
    accepted = await engine.web.accept_run(
        user,
        body.question,
        limits=limits,
        thread_id=body.thread_id,
        if_busy=body.if_busy,
        priority=body.priority,
        start_at=body.start_at,
        idempotency_key=idempotency_key,
        # Compared as parsed JSON between repeats of the key (read by BoundedJsonRoute).
        body=await request.json() if idempotency_key is not None else None,
    )
    response.status_code = accepted.status
    response.headers["Location"] = f"/v1/runs/{accepted.run.id}"
    return accepted.body


@router.get(
    "/runs",
    response_model=RunListOut,
    tags=["runs"],
    summary="The caller's runs",
    description="The caller's top-level runs, newest first, without their messages "
    "(`GET /v1/runs/{id}` has them); a sub-agent's run is reached through its tree "
    "(`GET /v1/runs/{id}/tree`, §18).",
    responses=responses((401, AUTH), (422, INVALID)),
)
async def list_runs(
    user: Caller,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many")] = 100,
    after: Annotated[
        str | None, Query(description="the page after this run (the page before's `after`)")
    ] = None,
) -> dict[str, Any]:
    found = await engine.list_runs(user, after=after, limit=limit)
    nxt = found.after
    return {
        "items": [run_to_json(run) for run in found],
        "more": found.more,
        "after": nxt,
        "next": None if nxt is None else f"/v1/runs?after={nxt}&limit={limit}",
    }


@router.get(
    "/runs/{run_id}",
    response_model=RunDetailOut,
    tags=["runs"],
    summary="A run with its messages",
    responses=responses((401, AUTH), (404, _NOT_FOUND), (422, INVALID)),
)
async def get_run(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    return (await engine.get_run(run_id, user=user)).to_json()


@router.get(
    "/runs/{run_id}/events",
    response_model=EventListOut,
    tags=["runs"],
    summary="A run's trace",
    description="What happened to the run, oldest first: for people, never used to "
    "rebuild the run.",
    responses=responses((401, AUTH), (404, _NOT_FOUND), (422, INVALID)),
)
async def run_events(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    await _owned(engine, run_id, user)
    found = await engine.events(run_id)
    return {
        "items": [
            {"id": e.id, "seq": e.seq, "at": iso(e.at), "kind": e.kind, "data": e.data}
            for e in found
        ]
    }


@router.get(
    "/runs/{run_id}/events/stream",
    tags=["runs"],
    summary="A run's events, live (Server-Sent Events)",
    description="`text/event-stream`: each stored event as `id: SEQ`, `event: KIND`, "
    "`data: {seq, at, kind, data}`, in order, after `Last-Event-ID` (which wins) or "
    "`?after=SEQ` (default 0: from the first); a `: keep-alive` comment every 15 s; the "
    "stream ends after the run reaches a terminal state. Reconnect with the last `id` "
    "seen to miss nothing. With `?deltas=1`, also `event: delta`, `data: {step, offset, "
    "text}`: the text of the step being generated as it is written (not stored, no `id:`; "
    "a (re)connecting client first gets the step's text so far at offset 0, and a step "
    "whose model call is repeated starts again at 0).",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the events"},
        **responses(
            (401, AUTH),
            (404, _NOT_FOUND),
            (422, INVALID),
            (
                429,
                "`too_many_streams`: the caller holds as many open streams as one user "
                "may in this process (`TETHER_MAX_STREAMS_PER_USER`; `limit`)",
            ),
        ),
    },
)
async def run_event_stream(
    request: Request,
    run_id: str,
    user: Caller,
    engine: EngineDep,
    after: Annotated[
        str | None, Query(description="the SEQ to start after (an integer >= 0)")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    deltas: Annotated[
        str | None,
        Query(
            description="`1`/`true`: also the text of the step being generated, as it is "
            "written (`event: delta`, no `id:`)"
        ),
    ] = None,
) -> Response:
    stream = await event_stream(
        engine, run_id, user, after=after, last_event_id=last_event_id, deltas=deltas
    )
    return stream_slots_of(request).held(user, stream, as_json)


@router.post(
    "/runs/{run_id}/continue",
    response_model=RunOut,
    tags=["runs"],
    summary="Continue a halted run",
    description="Grants the halted run more budget, deliberately and on the record: "
    "`limits` (within the configured cap) or by default `max_steps` and `max_tool_calls` "
    "+ 4, `max_spend_usd` and `max_elapsed_ms` times 1.5. The body is optional. A worker "
    "carries the run on.",
    responses=responses(
        (401, AUTH),
        (404, _NOT_FOUND),
        (
            409,
            "`not_halted`: only a halted run can be continued (or a waiting parent whose "
            "limits halted a run of its tree); `halted_by_ancestor` (`run_id`): continue "
            "that ancestor instead",
        ),
        (413, TOO_LARGE),
        (422, INVALID + "; or a limit is over the cap (`limit` and `cap` say which)"),
    ),
)
async def continue_run(
    run_id: str,
    user: Caller,
    engine: EngineDep,
    body: Annotated[ContinueIn | None, Body()] = None,
) -> dict[str, Any]:
    limits = None
    if body is not None and body.limits is not None:
        limits = body.limits.model_dump(exclude_none=True)
    run = await engine.continue_run(run_id, user, limits=limits, why=body.why if body else None)
    return (await engine.get_tree(run.id, user=user)).run_json(run)


@router.post(
    "/runs/{run_id}/cancel",
    response_model=RunOut,
    tags=["runs"],
    summary="Cancel a run",
    responses=responses(
        (401, AUTH),
        (404, _NOT_FOUND),
        (409, "`already_finished`: the run is answered, failed or cancelled"),
        (422, INVALID),
    ),
)
async def cancel_run(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    run = await engine.cancel_run(run_id, user)
    return (await engine.get_tree(run.id, user=user)).run_json(run)


@router.post(
    "/runs/{run_id}/fork",
    status_code=201,
    response_model=RunDetailOut,
    tags=["runs"],
    summary="Fork a run at a step",
    description="A new run of the caller's: the run's messages through step `at_step` "
    "(every message before the next model turn), halted with `forked` until it is "
    "continued, with the run's limits and nothing consumed, its `agent_version`, and "
    "`forked_from`. Nothing is executed again. Any run that is not running may be forked.",
    responses=responses(
        (401, AUTH),
        (404, _NOT_FOUND),
        (413, TOO_LARGE),
        (
            422,
            INVALID + "; or the run is running, or `at_step` is past its steps or inside "
            "a step whose calls have no result yet, or the run's limits are over the cap "
            "(`limit` and `cap` say which)",
        ),
    ),
)
async def fork_run(
    run_id: str, body: ForkIn, user: Caller, engine: EngineDep, response: Response
) -> dict[str, Any]:
    fork = await engine.fork_run(run_id, user, at_step=body.at_step, dry_run=body.dry_run)
    view = await engine.get_run(fork.id, user=user)
    response.headers["Location"] = f"/v1/runs/{fork.id}"
    return view.to_json()


# -- helpers -------------------------------------------------------------------------------


async def _owned(engine: Engine, run_id: str, user: str) -> None:
    """``not_found`` unless ``run_id`` names one of ``user``'s runs."""
    await engine.get_run(inputs.run_id(run_id), user=user)
