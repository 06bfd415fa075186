"""The JSON API under /v1 (SPEC §6): runs and their traces, approvals, continuation and
cancellation, for the caller of ``Authorization: Bearer API_KEY``.

Refusals are the engine's errors (SPEC §4), rendered by the app's handler as a 4xx
``{"ok": false, "error": CODE, "message": TEXT}``; a run that is missing or another
user's is one and the same ``not_found``. Input is validated before anything is stored.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Response, Security
from fastapi.security import HTTPBearer
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tether import inputs
from tether.api.deps import api_user, engine_of
from tether.budget import LimitsInput
from tether.engine import MAX_QUESTION_CHARS, Engine
from tether.errors import NotFound
from tether.resume import hop
from tether.runs import Run, RunState, iso, run_to_json

# Run ids are generated (uuid hex); anything else cannot name a run.

# Documents the scheme in the OpenAPI document; `api_user` does the checking.
_bearer = HTTPBearer(
    auto_error=False, description="An API key of the caller: `Authorization: Bearer API_KEY`."
)

router = APIRouter(dependencies=[Security(_bearer)])

Caller = Annotated[str, Depends(api_user)]
EngineDep = Annotated[Engine, Depends(engine_of)]


# -- input ---------------------------------------------------------------------------------


def _text(value: str) -> str:
    """Text the store can keep on both backends: no NUL, no lone surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode text") from exc
    return value


def _question(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return _text(value)


class StartRunIn(BaseModel):
    """A question for the agent, with optional limits over the configured defaults."""

    model_config = ConfigDict(extra="forbid")

    question: Annotated[
        str, Field(min_length=1, max_length=MAX_QUESTION_CHARS), AfterValidator(_question)
    ]
    limits: LimitsInput | None = None


class DecisionIn(BaseModel):
    """A human decision on a pending request."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "decline"]


class ContinueIn(BaseModel):
    """An explicit grant for a halted run: limits (default: SPEC §6's grant) and why."""

    model_config = ConfigDict(extra="forbid")

    limits: LimitsInput | None = None
    why: Annotated[str, Field(max_length=2000), AfterValidator(_text)] | None = None


# -- output --------------------------------------------------------------------------------


class LimitsOut(BaseModel):
    max_steps: int
    max_spend_usd: float
    max_tool_calls: int
    max_elapsed_ms: int


class ConsumedOut(BaseModel):
    steps: int
    spend_usd: float
    tool_calls: int
    elapsed_ms: int


class BudgetOut(BaseModel):
    limits: LimitsOut
    consumed: ConsumedOut


class PendingOut(BaseModel):
    """The request a suspended run waits on, from the stored tool call."""

    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    expires_at: str | None = Field(description="ISO-8601, UTC")


class RunOut(BaseModel):
    """A run without its messages."""

    id: str
    user_id: str
    question: str
    state: RunState
    step: int
    halt_reason: str | None
    fail_reason: str | None
    budget: BudgetOut
    pending: PendingOut | None = Field(description="set while the run is suspended")
    created_at: str = Field(description="ISO-8601, UTC")
    updated_at: str = Field(description="ISO-8601, UTC")


class RunDetailOut(RunOut):
    """A run with its messages (OpenAI chat format), the state the model sees."""

    messages: list[dict[str, Any]]


class RunListOut(BaseModel):
    items: list[RunOut]


class AcceptedOut(BaseModel):
    id: str
    state: RunState


class EventOut(BaseModel):
    id: int
    at: str = Field(description="ISO-8601, UTC")
    kind: str
    data: dict[str, Any]


class EventListOut(BaseModel):
    items: list[EventOut]


class ApprovalOut(BaseModel):
    """A decision that took effect, and where the run is now (``running``: the workers
    carry it on)."""

    model_config = ConfigDict(extra="allow")

    ok: Literal[True]
    run_id: str
    decision: Literal["approve", "decline"]
    state: str
    outcome: str = Field(description="executed, declined or released")


class ErrorOut(BaseModel):
    """Every refusal: a stable code and a message for people; some codes add fields."""

    model_config = ConfigDict(extra="allow")

    ok: Literal[False]
    error: str
    message: str


class DecisionOut(BaseModel):
    decision: str
    by: str
    at: str | None


class DiffOut(BaseModel):
    path: str
    before: Any
    after: Any


class ApprovalRefusedOut(ErrorOut):
    """A refused decision. ``already_resumed`` adds ``decision`` (the one that used the
    token); ``changed`` adds ``diff``, the new ``token``, ``preview`` and ``expires_at``;
    ``guard_failed`` adds ``reason``."""

    decision: DecisionOut | None = None
    diff: list[DiffOut] | None = None
    token: str | None = None
    preview: dict[str, Any] | None = None
    expires_at: str | None = None
    reason: str | None = None


_AUTH = "`unauthenticated`: no or an unknown API key"
_TOO_LARGE = "`payload_too_large`: the body is over 256 KiB"
_INVALID = "`invalid_input`: the body or a parameter is malformed; nothing was changed"
_NOT_FOUND = "`not_found`: no such run, or not the caller's"


def _responses(*pairs: tuple[int, str], model: type[ErrorOut] = ErrorOut) -> dict[int | str, Any]:
    return {status: {"model": model, "description": text} for status, text in pairs}


# -- runs ----------------------------------------------------------------------------------


@router.post(
    "/runs",
    status_code=202,
    response_model=AcceptedOut,
    tags=["runs"],
    summary="Start a run",
    description="Creates a run for the caller; it waits for a worker, which carries it to "
    "its next stop. Poll `GET /v1/runs/{id}`.",
    responses=_responses((401, _AUTH), (413, _TOO_LARGE), (422, _INVALID)),
)
async def start_run(
    body: StartRunIn, user: Caller, engine: EngineDep, response: Response
) -> dict[str, Any]:
    limits = body.limits.model_dump(exclude_none=True) if body.limits is not None else None
    run = await engine.start_run(user, body.question, limits=limits)
    response.headers["Location"] = f"/v1/runs/{run.id}"
    return {"id": run.id, "state": run.state.value}


@router.get(
    "/runs",
    response_model=RunListOut,
    tags=["runs"],
    summary="The caller's runs",
    description="The caller's runs, newest first, without their messages "
    "(`GET /v1/runs/{id}` has them).",
    responses=_responses((401, _AUTH), (422, _INVALID)),
)
async def list_runs(
    user: Caller,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many")] = 100,
) -> dict[str, Any]:
    found = await engine.list_runs(user, limit)
    return {"items": [run_to_json(run) for run in found]}


@router.get(
    "/runs/{run_id}",
    response_model=RunDetailOut,
    tags=["runs"],
    summary="A run with its messages",
    responses=_responses((401, _AUTH), (404, _NOT_FOUND), (422, _INVALID)),
)
async def get_run(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    view = await engine.get_run(run_id, user_id=user)
    return {**run_to_json(view.run), "messages": view.messages}


@router.get(
    "/runs/{run_id}/events",
    response_model=EventListOut,
    tags=["runs"],
    summary="A run's trace",
    description="What happened to the run, oldest first: for people, never used to "
    "rebuild the run.",
    responses=_responses((401, _AUTH), (404, _NOT_FOUND), (422, _INVALID)),
)
async def run_events(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    await _owned(engine, run_id, user)
    found = await engine.events(run_id)
    return {"items": [{"id": e.id, "at": iso(e.at), "kind": e.kind, "data": e.data} for e in found]}


@router.post(
    "/runs/{run_id}/continue",
    response_model=RunOut,
    tags=["runs"],
    summary="Continue a halted run",
    description="Grants the halted run more budget, deliberately and on the record: "
    "`limits` (within the configured cap) or by default `max_steps` and `max_tool_calls` "
    "+ 4, `max_spend_usd` and `max_elapsed_ms` times 1.5. The body is optional. A worker "
    "carries the run on.",
    responses=_responses(
        (401, _AUTH),
        (404, _NOT_FOUND),
        (409, "`not_halted`: only a halted run can be continued"),
        (413, _TOO_LARGE),
        (422, _INVALID + "; or the limits exceed the cap (`cap` says it)"),
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
    return run_to_json(run)


@router.post(
    "/runs/{run_id}/cancel",
    response_model=RunOut,
    tags=["runs"],
    summary="Cancel a run",
    responses=_responses(
        (401, _AUTH),
        (404, _NOT_FOUND),
        (409, "`already_finished`: the run is answered, failed or cancelled"),
        (422, _INVALID),
    ),
)
async def cancel_run(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    return run_to_json(await engine.cancel_run(run_id, user))


# -- approvals -----------------------------------------------------------------------------


@router.post(
    "/approvals/{token}",
    response_model=ApprovalOut,
    tags=["approvals"],
    summary="Decide a pending request",
    description="Approves or declines the request a suspended run waits on, as the "
    "caller. The decision is carried out in this request (re-checks, then the tool or "
    "the decline); the rest of the run goes to the workers. A token is used once.",
    responses={
        **_responses(
            (401, _AUTH),
            (403, "`no_longer_permitted`: the owner's permissions changed; the run is halted"),
            (404, "`unknown_or_expired`: no such token, expired, or not the caller's to use"),
            (413, _TOO_LARGE),
            (422, _INVALID),
        ),
        **_responses(
            (
                409,
                "`already_resumed` (with `decision`), `changed` (with `diff` and a new "
                "`token`: review again), `guard_failed` (with `reason`)",
            ),
            model=ApprovalRefusedOut,
        ),
    },
)
async def decide(token: str, body: DecisionIn, user: Caller, engine: EngineDep) -> dict[str, Any]:
    # Shielded: a client that hangs up must not interrupt a claimed decision mid-way.
    result = await asyncio.shield(engine.resume_after_confirmation(token, body.decision, user))
    return {**result.to_json(), "ok": True}


# -- helpers -------------------------------------------------------------------------------


async def _owned(engine: Engine, run_id: str, user: str) -> Run:
    run = await hop(engine.store.get_run, inputs.run_id(run_id))
    if run is None or run.user_id != user:
        raise NotFound("no such run")
    return run
