"""Deciding every pending call of a turn at once (reference §6, §15): the "decide them all"
form of a run's page and of the inbox posts here, with approve all, decline all, or a
choice per call, and the engine's ``decide_calls`` records them all in one request (the
last decision of the suspension carries the turn out). The same session and CSRF rule as
every form that acts; each call's answer is shown as its own."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tether import inputs
from tether.api.deps import engine_of
from tether.api.schemas import DECISIONS
from tether.api.web import carried
from tether.api.web.back import run_link
from tether.api.web.inbox import no_such_run
from tether.api.web.pages import message, outcome
from tether.api.web.sign_in import acting, back_to, field
from tether.errors import InvalidInput, NotFound
from tether.results import CallVerdict

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

# At most this many calls in one form (the engine's own bound on one request).
MAX_CALLS = 100
# The buttons of the form: every call approved, every call declined, or each as chosen.
_ALL = frozenset({"approve", "decline", "each"})


@router.post("/runs/{run_id}/decisions")
async def decide_all(request: Request, run_id: str) -> Response:
    """The calls the form names, each with the decision chosen for it (or the one its
    button gives them all), decided in one request; the page says what became of each."""
    got = await acting(request, back_to(f"/runs/{run_id}"))
    if isinstance(got, Response):
        return got
    session, form = got
    if not inputs.RUN_ID.fullmatch(run_id):
        return no_such_run(request, session)
    try:
        entries = read_decisions(form)
    except InvalidInput as exc:
        return message(request, session, 422, "Invalid", exc.message, kind="refused")
    engine = engine_of(request)
    try:
        answers = await engine.decide_calls(run_id, session.user, entries)
    except NotFound:
        return no_such_run(request, session)
    except InvalidInput as exc:
        return message(request, session, 422, "Invalid", exc.message, kind="refused")
    log.info(
        "decided a turn on the web",
        extra={"run_id": run_id, "action": "web_decisions"},
    )
    shown = [answer.to_json() for answer in answers]
    last = answers[-1].result
    waiting = last.waiting_for if last is not None and last.outcome is CallVerdict.RECORDED else 0
    # Every call this request carried out, those decided earlier by others included, each
    # as it was carried out (reference §15).
    also = [c for a in shown for c in a.get("carried", ())]
    answered = await carried.rows(engine, run_id, [*shown, *also])
    again = carried.waiting_again(answered)
    context = {
        "answers": answered,
        "again": again,
        "run_id": run_id,
        "waiting": 0 if again else waiting or 0,
        "wrote": carried.wrote(answered),
    }
    # Every call decided, yet none carried out: its user is at the cap (reference §13).
    context["held"] = last is not None and last.outcome is CallVerdict.RECORDED and not waiting
    back = await run_link(engine, run_id, session.user)
    return outcome(request, session, 200, "decisions", back=back, **context)


def read_decisions(form: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The decisions a decide-all form posted: ``call.N`` names a call, ``digest.N`` the
    preview digest the page showed it with, and the button (``all``) gives every call its
    decision or, as ``each``, leaves it to ``decision.N`` (empty: leave the call for now).
    ``InvalidInput`` when nothing is decided."""
    button = field(form, "all")
    if button not in _ALL:
        raise InvalidInput("choose approve all, decline all, or decide as chosen")
    reason = field(form, "reason").replace("\r\n", "\n").strip() or None
    entries: list[dict[str, Any]] = []
    for n in range(MAX_CALLS):
        call = field(form, f"call.{n}")
        if not call:
            break
        decision = button if button != "each" else field(form, f"decision.{n}")
        if decision not in DECISIONS:
            continue  # left for now
        entry: dict[str, Any] = {"tool_call_id": call, "decision": decision}
        digest = field(form, f"digest.{n}")
        if decision == "approve" and digest:
            entry["digest"] = digest  # approved as shown: changed since is not approved
        if reason is not None:
            entry["reason"] = reason
        entries.append(entry)
    if not entries:
        raise InvalidInput("choose approve or decline for at least one action")
    return entries
