"""The signed-in user's runs, newest first, a page at a time (filtered by state), and what
the owner does to one from its page: continue it when it is halted, cancel it when it is
not terminal. Both are POSTs bound to the session's CSRF token like every form that acts,
and both are the engine's own ``continue_run`` / ``cancel_run`` as the session's user, so
only the run's owner may (reference §1, §6)."""

from __future__ import annotations

import logging
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tether.api.deps import engine_of
from tether.api.web.inbox import no_such_run, run_response
from tether.api.web.pages import message, page
from tether.api.web.sessions import acting, back_to, field, login_url, session_of
from tether.errors import AlreadyFinished, InvalidInput, NotFound, NotHalted
from tether.runs import RunState

log = logging.getLogger(__name__)

# How many runs a page lists.
PAGE_SIZE = 50

router = APIRouter(include_in_schema=False)


@router.get("/runs")
async def runs(request: Request, state: str = "", after: str = "") -> Response:
    """The viewer's runs, newest first: all, or those in ``state``; ``after`` is the last
    run of the page before (the "next page" link carries it)."""
    session = await session_of(request)
    if session is None:
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(login_url(f"/runs{query}"), status_code=303)
    try:
        found = await engine_of(request).runs_page(
            session.user, state=state or None, after=after or None, limit=PAGE_SIZE
        )
    except (InvalidInput, NotFound) as exc:
        text = exc.message if isinstance(exc, InvalidInput) else "There is no such page of runs."
        return message(request, session, 422, "Invalid", text, kind="refused")
    following = None
    if found.after is not None:
        following = "/runs?" + urlencode({"state": state, "after": found.after})
    context = {
        "runs": found.runs,
        "more": found.more,
        "next": following,
        "state": state,
        "states": [s.value for s in RunState],
    }
    return page(request, "runs.html", context, session=session)


@router.post("/runs/{run_id}/continue")
async def continue_run(request: Request, run_id: str) -> Response:
    """Continue the owner's halted run with the default grant (the one its page showed)
    and the optional reason as its ``why``; show the run again (303). A run that is no
    longer halted, or a refused grant, shows its page with why (409, 422)."""
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
    except (NotHalted, InvalidInput) as exc:
        status = 409 if isinstance(exc, NotHalted) else 422
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
