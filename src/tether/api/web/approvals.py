"""Approval links and decisions: show the request behind a link (a GET never changes
anything: mail scanners open links, reference §6) and act only on a signed-in POST carrying the
session's CSRF token, from the link's page or from the inbox."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tether import ApprovalResult, inputs
from tether.api.deps import engine_of
from tether.api.schemas import DECISIONS
from tether.api.web import carried
from tether.api.web.back import run_link, run_of_token
from tether.api.web.pages import (
    message,
    outcome,
    page,
    sign_in_first,
    token_view,
    unknown_or_expired,
)
from tether.api.web.shown import when
from tether.api.web.sign_in import (
    SignIn,
    acting,
    back_to,
    field,
    login_url,
    sign_in_of,
)
from tether.engine import Engine
from tether.errors import (
    AlreadyDecided,
    AlreadyResumed,
    Changed,
    FourEyes,
    GuardFailed,
    InvalidInput,
    NoLongerPermitted,
    PendingToolUnavailable,
    TetherError,
    UnknownOrExpired,
    WrongVersion,
)
from tether.results import CallVerdict

log = logging.getLogger(__name__)

MAX_TOKEN_CHARS = 200

router = APIRouter(include_in_schema=False)


@router.get("/approve/{token}")
async def approval_page(request: Request, token: str) -> Response:
    """Shows the request behind an approval link. Never changes anything."""
    session = await sign_in_of(request)
    if session is None:
        return message(
            request,
            None,
            200,
            "Sign in to review this request",
            "This is an approval link. Sign in to see the request and decide it.",
            sign_in=login_url(f"/approve/{token}"),
        )
    if not token or len(token) > MAX_TOKEN_CHARS:
        return unknown_or_expired(request, session)
    engine = engine_of(request)
    try:
        lookup = await engine.web.approval_request(token, session.user)
    except UnknownOrExpired:
        return unknown_or_expired(request, session)
    view = await token_view(engine, lookup, session.user, token)
    if view is not None:
        context = {"item": view, "error": None}
        return page(request, "approve.html", context, session=session)
    if lookup.used is not None and lookup.decided_run is not None:
        used = lookup.used
        shown = {
            "decision": used.decision,
            "by": used.by,
            "at": when(used.at),
            "reason": used.reason,
            "arguments": used.arguments,
        }
        back = await run_link(engine, lookup.decided_run.id, session.user)
        return outcome(request, session, 200, "already_resumed", decision=shown, back=back)
    expired = lookup.expired.id if lookup.expired is not None else None
    return unknown_or_expired(request, session, expired)


@router.post("/approve/{token}")
async def decide(request: Request, token: str) -> Response:
    """Acts on an approval link: only a signed-in user's POST with the session's CSRF token.
    The engine claims first, so a double submission resumes once."""
    got = await acting(
        request, lambda: sign_in_first(request, login_url(f"/approve/{token}"), "decided")
    )
    if isinstance(got, Response):
        return got
    session, form = got
    decision = field(form, "decision")
    if decision not in DECISIONS:
        return _invalid_decision(request, session)
    try:
        reason, arguments = _reason_and_arguments(form)
    except InvalidInput as exc:
        return _invalid(request, session, exc)
    deciding = engine_of(request).resume_after_confirmation(
        token,
        decision,
        session.user,
        reason=reason,
        arguments=arguments,
        digest=field(form, "digest") or None,
    )
    return await _carry_out(
        request, session, deciding, reason=reason, arguments=arguments, token=token
    )


@router.post("/runs/{run_id}/decision")
async def decide_from_inbox(request: Request, run_id: str) -> Response:
    """Acts from the inbox, which has no token: the form names the call and the preview
    digest the user was shown; same CSRF rule, same claim, same outcomes."""
    got = await acting(request, back_to("/"))
    if isinstance(got, Response):
        return got
    session, form = got
    decision = field(form, "decision")
    call, shown = field(form, "tool_call_id"), field(form, "digest")
    if decision not in DECISIONS or not call or not inputs.RUN_ID.fullmatch(run_id):
        return _invalid_decision(request, session)
    try:
        reason, arguments = _reason_and_arguments(form)
    except InvalidInput as exc:
        return _invalid(request, session, exc)
    deciding = engine_of(request).web.resume_by_run(
        run_id,
        decision,
        session.user,
        tool_call_id=call,
        shown_digest=shown or None,
        reason=reason,
        arguments=arguments,
        digest=field(form, "approved_digest") or None,
    )
    return await _carry_out(
        request, session, deciding, reason=reason, arguments=arguments, run_id=run_id
    )


def _reason_and_arguments(form: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """A decision form's reason (None when left empty) and edited arguments (the hidden
    JSON of a previewed edit; None when the form carries none). The engine checks both."""
    reason = field(form, "reason").replace("\r\n", "\n").strip() or None
    text = field(form, "arguments")
    if not text:
        return reason, None
    arguments = inputs.json_value(text, "the edited arguments")
    if not isinstance(arguments, dict):
        raise InvalidInput("the edited arguments must be a JSON object")
    return reason, arguments


def _invalid(request: Request, session: SignIn, exc: InvalidInput) -> Response:
    return message(request, session, 422, "Invalid", exc.message, kind="refused")


def _invalid_decision(request: Request, session: SignIn) -> Response:
    return message(
        request, session, 422, "Invalid decision", "Choose approve or decline.", kind="refused"
    )


# What a refused decision's page is: its HTTP status, the outcome it shows, and what
# the page says of it.
Refusal = tuple[int, str, dict[str, Any]]


async def _carry_out(
    request: Request,
    session: SignIn,
    deciding: Awaitable[ApprovalResult],
    *,
    reason: str | None,
    arguments: dict[str, Any] | None,
    run_id: str | None = None,
    token: str | None = None,
) -> Response:
    """Awaits the decision and renders what became of it (with the reason and edited
    arguments it carried), or why there was none, with what became of every other call of
    its turn it carried out (reference §15); either page leads back to the run (``run_id``,
    or the run ``token`` names)."""
    engine = engine_of(request)
    try:
        result = await deciding
    except UnknownOrExpired as exc:
        return unknown_or_expired(request, session, exc.details.get("run_id"))
    except InvalidInput as exc:
        return _invalid(request, session, exc)
    except TetherError as exc:
        also = await _also(engine, session.user, exc, run_id, token)
        status, kind, context = await _refusal(engine, session, exc, also)
        if kind == "changed" and context["item"] is not None:
            run_id = context["item"].run.id  # the run suspended again, on a new token
    else:
        log.info(
            "decided on the web",
            extra={"run_id": result.run_id, "action": "web_decision", "state": result.state},
        )
        also = await _also(engine, session.user, result, result.run_id, None)
        status, kind, run_id = 200, "done", result.run_id
        context = {
            "result": result,
            "reason": reason,
            "arguments": arguments,
            "carried": also,
            "wrote": result.outcome is CallVerdict.EXECUTED or carried.wrote(also),
        }
    if run_id is None and token is not None:
        run_id = await run_of_token(engine, token, session.user)
    back = await run_link(engine, run_id, session.user)
    return outcome(request, session, status, kind, back=back, **context)


async def _refusal(
    engine: Engine, session: SignIn, exc: TetherError, also: list[dict[str, Any]]
) -> Refusal:
    """Why a decision took no effect on its own call, as its page shows it, with the other
    calls of its turn its request carried out (``also``); an error no page explains is
    raised again (the app's handler answers it)."""
    match exc:
        case AlreadyResumed():
            used = exc.details.get("decision") or {}
            decided = {
                "decision": used.get("decision"),
                "by": used.get("by"),
                "at": _iso_for_people(used.get("at")),
                "reason": used.get("reason"),
                "arguments": used.get("arguments"),
            }
            return 409, "already_resumed", {"decision": decided}
        case AlreadyDecided():  # one approval a person (reference §19)
            return 409, "already_decided", {"reason": exc.message}
        case Changed():
            return 409, "changed", await _changed(engine, session, exc, also)
        case GuardFailed():
            reason = str(exc.details.get("reason") or exc.message)
            return 409, "guard_failed", {"reason": reason, "carried": also}
        case NoLongerPermitted() | FourEyes():
            return 403, exc.code, {"reason": exc.message, "carried": also}
        case WrongVersion() | PendingToolUnavailable():
            return 409, exc.code, {"reason": exc.message, "carried": also}
    raise exc


async def _also(
    engine: Engine,
    viewer: str,
    answer: ApprovalResult | TetherError,
    run_id: str | None,
    token: str | None,
) -> list[dict[str, Any]]:
    """The other calls ``answer``'s request carried out, as the page shows them: each
    with the action it names, from its run (``run_id``, the refusal's, or the run of the
    ``token`` its decision used)."""
    shown = carried.carried_by(answer)
    if not shown:
        return []
    if run_id is None and isinstance(answer, TetherError):
        run_id = answer.details.get("run_id")
    if run_id is None and token is not None:
        try:
            lookup = await engine.web.approval_request(token, viewer)
        except UnknownOrExpired:
            lookup = None
        run = lookup and (lookup.decided_run or lookup.run)
        run_id = run.id if run else None
    return await carried.rows(engine, run_id, shown)


def _iso_for_people(stamp: Any) -> str:
    return str(stamp)[:19].replace("T", " ") + " UTC" if stamp else "—"


async def _changed(
    engine: Engine, session: SignIn, exc: Changed, also: list[dict[str, Any]]
) -> dict[str, Any]:
    """The diff side by side, and the new request (from the store, by its new token) with
    its own Approve / Decline form; with the calls of its turn carried out before it."""
    new_token = str(exc.details.get("token") or "")
    item = None
    if new_token:
        lookup = await engine.web.approval_request(new_token, session.user)
        item = await token_view(engine, lookup, session.user, new_token)
    diff = list(exc.details.get("diff") or [])
    return {"diff": diff, "item": item, "carried": also, "wrote": carried.wrote(also)}
