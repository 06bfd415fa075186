"""The signed-in user's runs, newest first, a page at a time (filtered by state), and what
the owner does to one from its page: continue it when it is halted, cancel it when it is
not terminal, ask a follow-up in its thread (reference §14). Each is a POST bound to the
session's CSRF token like every form that acts, and each is the engine's own
``continue_run`` / ``cancel_run`` / ``start_run`` as the session's user, on the session
user's own run, so only the run's owner may (reference §1, §6)."""

from __future__ import annotations

import logging
from dataclasses import replace
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tether.api.deps import engine_of
from tether.api.web.inbox import no_such_run, run_response
from tether.api.web.pages import message, page
from tether.api.web.sign_in import acting, back_to, field, login_url, sign_in_of
from tether.api.web.status import state_note
from tether.api.web.threads import read_follow_up
from tether.errors import (
    AlreadyFinished,
    HaltedByAncestor,
    InvalidInput,
    NotFound,
    NotHalted,
    ThreadBusy,
)
from tether.runs import RunState

log = logging.getLogger(__name__)

# How many runs a page lists.
PAGE_SIZE = 50

router = APIRouter(include_in_schema=False)


@router.get("/runs")
async def runs(request: Request, state: str = "", after: str = "") -> Response:
    """The viewer's runs, newest first: all, or those in ``state``; ``after`` is the last
    run of the page before (the "next page" link carries it)."""
    session = await sign_in_of(request)
    if session is None:
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(login_url(f"/runs{query}"), status_code=303)
    engine = engine_of(request)
    try:
        found = await engine.list_runs(
            session.user, state=state or None, after=after or None, limit=PAGE_SIZE
        )
    except (InvalidInput, NotFound) as exc:
        text = exc.message if isinstance(exc, InvalidInput) else "There is no such page of runs."
        return message(request, session, 422, "Invalid", text, kind="refused")
    following = None
    if found.after is not None:
        following = "/runs?" + urlencode({"state": state, "after": found.after})
    now = await engine.now()
    context = {
        "runs": found.runs,
        "notes": {run.id: state_note(run, now) for run in found.runs},
        "more": found.more,
        "next": following,
        "state": state,
        "states": [s.value for s in RunState],
    }
    return page(request, "runs.html", context, session=session)


@router.post("/runs/{run_id}/continue")
async def continue_run(request: Request, run_id: str) -> Response:
    """Continue the owner's halted run (or the waiting parent whose limits halted runs of
    its tree, reference §18) with the default grant (the one its page showed) and the
    optional reason as its ``why``; show the run again (303). A run that is no longer
    halted, one an ancestor's limits halted, or a refused grant, shows its page with why
    (409, 422)."""
    got = await acting(request, back_to(f"/runs/{run_id}"))
    if isinstance(got, Response):
        return got
    session, form = got
    typed = field(form, "reason")
    why = typed.replace("\r\n", "\n").strip() or None
    engine = engine_of(request)
    try:
        await engine.continue_run(run_id, session.user, why=why)
    except NotFound:  # missing, or not theirs: the same page either way
        return no_such_run(request, session)
    except (NotHalted, HaltedByAncestor, InvalidInput) as exc:
        status = 422 if isinstance(exc, InvalidInput) else 409
        refused = f"Not continued: {exc.message}."
        return await run_response(
            request, session, run_id, status=status, refused=refused, reason=typed
        )
    log.info("continued on the web", extra={"run_id": run_id, "action": "web_continue"})
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, run_id: str) -> Response:
    """Cancel the owner's run that is not terminal; show it again (303). A run that has
    finished meanwhile shows its page with why (409)."""
    got = await acting(request, back_to(f"/runs/{run_id}"))
    if isinstance(got, Response):
        return got
    session, _ = got
    engine = engine_of(request)
    try:
        await engine.cancel_run(run_id, session.user)
    except NotFound:
        return no_such_run(request, session)
    except AlreadyFinished as exc:
        refused = f"Not cancelled: {exc.message}."
        return await run_response(request, session, run_id, status=409, refused=refused)
    log.info("cancelled on the web", extra={"run_id": run_id, "action": "web_cancel"})
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/follow-up")
async def follow_up(request: Request, run_id: str) -> Response:
    """Ask the posted question as a follow-up in the thread of the owner's run, queued
    behind a busy thread if the box says so, and show the new run (303). A busy thread
    (409) or a refused question (422) shows the run's page again with why and what was
    typed; nothing is created."""
    got = await acting(request, back_to(f"/runs/{run_id}"))
    if isinstance(got, Response):
        return got
    session, form = got
    asked = read_follow_up(form)
    engine = engine_of(request)
    try:
        run = (await engine.get_run(run_id, user=session.user)).run
        started = await engine.start_run(
            session.user,
            asked.question,
            thread_id=run.thread_id,
            if_busy="enqueue" if asked.enqueue else "reject",
        )
    except NotFound:  # missing, not theirs, or its thread deleted meanwhile
        return no_such_run(request, session)
    except ThreadBusy as exc:
        busy = replace(
            asked,
            error="Not sent: a run of this thread is still going.",
            waits_on=str(exc.details.get("run_id") or "") or None,
        )
        return await run_response(request, session, run_id, status=409, follow_up=busy)
    except InvalidInput as exc:
        bad = replace(asked, error=f"Not sent: {exc.message}.")
        return await run_response(request, session, run_id, status=422, follow_up=bad)
    log.info(
        "follow-up on the web",
        extra={"run_id": started.id, "action": "web_follow_up", "state": started.state.value},
    )
    return RedirectResponse(f"/runs/{started.id}", status_code=303)
