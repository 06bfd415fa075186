"""Editing a pending call before approving it (reference §9), with no scripts: the edit form
(generated from the tool's schema) posts here, and the page answers with the preview
re-rendered from the edited arguments and its digest, then the approval form that carries
both. Nothing is claimed or changed here; the decision is a separate POST."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tether import ApprovalPreview, inputs
from tether.api.deps import engine_of
from tether.api.web.approvals import MAX_TOKEN_CHARS
from tether.api.web.deciders import who_may
from tether.api.web.forms import edit_fields, read_edits
from tether.api.web.pages import (
    PendingView,
    message,
    page,
    pending_view,
    run_target,
    sign_in_first,
    token_view,
    tool_parameters,
    undecided_call,
    unknown_or_expired,
)
from tether.api.web.sign_in import (
    SignIn,
    acting,
    back_to,
    field,
    login_url,
)
from tether.errors import FourEyes, InvalidInput, TetherError, UnknownOrExpired

router = APIRouter(include_in_schema=False)

Previewing = Callable[[dict[str, Any]], Awaitable[ApprovalPreview]]


@router.post("/approve/{token}/preview")
async def preview_from_link(request: Request, token: str) -> Response:
    """The request behind an approval link with the posted edits, re-rendered; the same
    session, CSRF and authorisation rules as deciding, and nothing changes."""
    got = await acting(
        request, lambda: sign_in_first(request, login_url(f"/approve/{token}"), "changed")
    )
    if isinstance(got, Response):
        return got
    session, form = got
    if not token or len(token) > MAX_TOKEN_CHARS:
        return unknown_or_expired(request, session)
    engine = engine_of(request)
    try:
        lookup = await engine.web.approval_request(token, session.user)
    except UnknownOrExpired:
        return unknown_or_expired(request, session)
    item = await token_view(engine, lookup, session.user, token)
    if item is None:
        return unknown_or_expired(request, session)

    def previewing(arguments: dict[str, Any]) -> Awaitable[ApprovalPreview]:
        return engine.preview_approval(token, session.user, arguments)

    return await _edited(request, session, item, form, previewing)


@router.post("/runs/{run_id}/preview")
async def preview_from_inbox(request: Request, run_id: str) -> Response:
    """The same from the inbox or the run's page, which name the call and the digest of the
    preview they showed (carried on into the approval form)."""
    got = await acting(request, back_to("/"))
    if isinstance(got, Response):
        return got
    session, form = got
    call, shown = field(form, "tool_call_id"), field(form, "digest")
    if not call or not inputs.RUN_ID.fullmatch(run_id):
        return unknown_or_expired(request, session)
    engine = engine_of(request)
    run = await engine.web.request_of_run(run_id, call, session.user)
    named = undecided_call(run, call)
    now = await engine.now()
    who = await who_may(engine, [run])
    item = pending_view(run, session.user, now, agent=engine.agent, call=named, who=who)
    item = item if named else None
    if item is None:
        return unknown_or_expired(request, session)
    item = dataclasses.replace(item, target=run_target(run_id, call, shown))

    def previewing(arguments: dict[str, Any]) -> Awaitable[ApprovalPreview]:
        return engine.web.preview_by_run(
            run_id, session.user, tool_call_id=call, arguments=arguments
        )

    return await _edited(request, session, item, form, previewing)


async def _edited(
    request: Request,
    session: SignIn,
    item: PendingView,
    form: Mapping[str, Any],
    previewing: Previewing,
) -> Response:
    """The edited call's preview and approval form; or, for edits that do not validate,
    the request again with what is wrong and the edits as typed (422), still decidable."""
    pending = item.call
    agent = engine_of(request).agent.agent_of(item.run.agent_version)
    parameters = tool_parameters(agent, pending.tool) or {}
    try:
        shown = await previewing(read_edits(parameters, form, pending.arguments))
    except InvalidInput as exc:
        again = dataclasses.replace(item, fields=edit_fields(parameters, {}, submitted=form))
        context = {"item": again, "error": exc.message}
        return page(request, "approve.html", context, session=session, status=422)
    except UnknownOrExpired:
        return unknown_or_expired(request, session)
    except FourEyes as exc:
        text = f"Nothing was previewed or decided: {exc.message}."
        return message(request, session, 403, "Someone else decides this", text, kind="refused")
    except TetherError as exc:
        text = f"The edited action could not be previewed: {exc.message}. Nothing was decided."
        return message(request, session, 409, "No preview", text, kind="refused")
    context = {
        "item": dataclasses.replace(item, fields=edit_fields(parameters, shown.arguments)),
        "shown": shown,
        # Carried as JSON with every character past ASCII escaped: it reads back as exactly
        # these arguments, and the form holds no hidden character (reference §6).
        "arguments": json.dumps(shown.arguments, sort_keys=True),
        "changes": _changes(pending.arguments, shown.arguments),
    }
    return page(request, "preview.html", context, session=session)


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The arguments an edit changed: name, as requested, as edited."""
    names = dict.fromkeys([*before, *after])
    return [
        {"path": name, "before": before.get(name), "after": after.get(name)}
        for name in names
        if before.get(name) != after.get(name)
    ]
