"""The inbox and a run's page: the pending requests a signed-in user owns or may approve,
and one of their runs with its budget, lineage, timeline and messages, and the forms that
continue, cancel and fork it; or, for an approver, the run behind a request they may
decide, read-only. Pages render the pending request from the stored tool call and
preview, never from the model's prose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tether.api.deps import engine_of
from tether.api.statuses import status_for
from tether.api.web import lineage, threads, timeline, trees
from tether.api.web.actions import actions_for
from tether.api.web.deciders import who_may
from tether.api.web.pages import message, page, turn_view
from tether.api.web.shown import show
from tether.api.web.sign_in import SignIn, acting, back_to, login_url, sign_in_of
from tether.api.web.status import cancelled_by, state_note
from tether.budget import Budget
from tether.errors import InvalidInput, NotFound, TetherError
from tether.models.base import Message
from tether.runs import Run, RunState

# How many open suspensions (soonest expiry first) one page of the inbox shows; the page
# says how many more there are and links to the next (``/?after=CURSOR``).
INBOX_LIMIT = 100

router = APIRouter(include_in_schema=False)


@router.get("/")
async def inbox(request: Request) -> Response:
    """The requests waiting on the signed-in user, soonest expiry first."""
    session = await sign_in_of(request)
    if session is None:
        return RedirectResponse(login_url("/"), status_code=303)
    engine = engine_of(request)
    try:
        after = request.query_params.get("after")
        found = await engine.pending_approvals(session.user, after=after, limit=INBOX_LIMIT)
    except InvalidInput as exc:
        return message(request, session, 422, "Not a page", exc.message, kind="refused")
    except TetherError as exc:  # a scope that cannot be resolved: never an empty inbox
        text = f"{exc.message} ({exc.code})"
        return message(
            request, session, status_for(exc.code), "Cannot list the requests", text, kind="refused"
        )
    who = await who_may(engine, found.runs)
    views = (turn_view(run, session.user, found.now, agent=engine.agent, who=who) for run in found)
    items = [view for view in views if view is not None]
    context = {"items": items, "more": found.more, "after": found.after}
    return page(request, "inbox.html", context, session=session)


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str) -> Response:
    """A run for its owner: state, version, thread and lineage, its tree of sub-agents
    (on the root's page, with every call of the tree waiting for a decision), budget,
    pending request, the forms that continue, cancel, fork and follow it up, timeline and
    messages; for an
    approver of its pending request, that request with the run's question and
    conversation."""
    session = await sign_in_of(request)
    if session is None:
        return RedirectResponse(login_url(f"/runs/{run_id}"), status_code=303)
    return await run_response(request, session, run_id)


@router.post("/runs/{run_id}/fork")
async def fork(request: Request, run_id: str) -> Response:
    """Fork the signed-in owner's run from the posted step (reference §12), with the session's
    CSRF token like every form that acts, and show the new run (303). A refused step shows
    the run's page again with why (422)."""
    got = await acting(request, back_to(f"/runs/{run_id}"))
    if isinstance(got, Response):
        return got
    session, form = got
    engine = engine_of(request)
    try:
        at_step, dry_run = lineage.read_fork(form)
        forked = await engine.fork_run(run_id, session.user, at_step=at_step, dry_run=dry_run)
    except NotFound:
        return no_such_run(request, session)
    except InvalidInput as exc:
        return await run_response(request, session, run_id, status=422, submitted=form, error=exc)
    return RedirectResponse(f"/runs/{forked.id}", status_code=303)


async def run_response(
    request: Request,
    session: SignIn,
    run_id: str,
    *,
    status: int = 200,
    submitted: Mapping[str, Any] | None = None,
    error: InvalidInput | None = None,
    refused: str | None = None,
    reason: str = "",
    follow_up: threads.FollowUp | None = None,
    notice: str | None = None,
) -> Response:
    """A run's page: its owner's whole page (with the fork form refused with ``error``, the
    Continue and Cancel forms with why the last was ``refused``, or the follow-up box
    with why the last ``follow_up`` was refused), its pending calls under ``notice`` (what
    became of a decision); for an approver, the read-only page of the requests they may
    decide; for anyone else, not found."""
    engine = engine_of(request)
    try:
        view = await engine.get_run(run_id, user=session.user)
    except NotFound:
        return await _as_approver(request, session, run_id, notice=notice)
    events = await engine.events(run_id)
    run = view.run
    now = await engine.now()
    pending = None
    if run.state is RunState.SUSPENDED:
        who = await who_may(engine, [run])
        pending = turn_view(run, session.user, now, agent=engine.agent, who=who)
    tree = await trees.tree_panel(engine, run, session.user, now)
    fork_form = lineage.fork_form(run, view.messages)
    if error is not None:
        fork_form = lineage.refused(run, submitted or {}, error.message)
    context: dict[str, Any] = {
        "run": run,
        "owner": True,
        "pending": pending,
        "notice": notice,
        "budget": _budget_rows(run, tree.consumed_tree if tree else None),
        "actions": actions_for(
            run, error=refused, reason=reason, holds=tree is not None and tree.holding > 0
        ),
        "state_note": state_note(run, now, by=cancelled_by(events)),
        "events": [timeline.line(e) for e in events],
        "messages": [_message_view(m) for m in view.messages],
        "fork": fork_form,
        "thread": await threads.thread_panel(engine, run, session.user, refused=follow_up),
        "tree": tree,
        **await lineage.lineage(engine, run, session.user),
    }
    return page(request, "run.html", context, session=session, status=status)


async def _as_approver(
    request: Request, session: SignIn, run_id: str, *, notice: str | None = None
) -> Response:
    """The run behind a request the viewer may decide (not their own run): its question,
    conversation and the calls its turn waits on, and nothing they could act on but the
    decisions. Shown exactly while they may decide one; otherwise the page of a missing
    run."""
    engine = engine_of(request)
    try:
        view = await engine.get_run(run_id)
    except NotFound:
        return no_such_run(request, session)
    run = None
    if view.run.state is RunState.SUSPENDED:
        # The first call they may decide: an escalated one's people may decide only it.
        for call in view.run.undecided_calls():
            run = await engine.web.request_of_run(run_id, call.tool_call_id, session.user)
            if run is not None:
                break
    now = await engine.now()
    who = await who_may(engine, [run])
    pending = turn_view(run, session.user, now, agent=engine.agent, who=who)
    if run is None or pending is None:
        return no_such_run(request, session)
    context: dict[str, Any] = {
        "run": run,
        "owner": False,
        "pending": pending,
        "state_note": state_note(run, now),
        "events": (),  # the timeline is its owner's
        "tree": None,  # and so is its tree
        "notice": notice,
        "messages": [_message_view(m) for m in view.messages],
    }
    return page(request, "run.html", context, session=session)


def no_such_run(request: Request, session: SignIn) -> Response:
    return message(request, session, 404, "Not found", "There is no such run.", kind="refused")


def _budget_rows(run: Run, tree: Budget | None) -> list[tuple[str, Any, Any, Any]]:
    """Each measure: the run's own consumption, with its descendants' (``tree``, when it
    started any; else None), and its limit."""
    limits, used, whole = run.limits, run.budget, tree or Budget()
    return [
        ("steps", used.steps, whole.steps, limits.max_steps),
        (
            "spend (USD)",
            f"{used.spend_usd:.4f}",
            f"{whole.spend_usd:.4f}",
            f"{limits.max_spend_usd:.4f}",
        ),
        ("tool calls", used.tool_calls, whole.tool_calls, limits.max_tool_calls),
        ("active time (ms)", used.elapsed_ms, whole.elapsed_ms, limits.max_elapsed_ms),
    ]


def _message_view(msg: Message) -> dict[str, Any]:
    content = msg.get("content")
    calls = []
    for raw in msg.get("tool_calls") or []:
        function = raw.get("function") or {}
        calls.append({"name": function.get("name"), "arguments": function.get("arguments")})
    return {
        "role": str(msg.get("role")),
        "content": content if isinstance(content, str) or content is None else show(content),
        "tool_calls": calls,
        "tool_call_id": msg.get("tool_call_id"),
    }
