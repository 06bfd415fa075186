"""The approvals inbox: server-rendered pages to sign in, list pending requests, review and
decide an approval link, and read a run. No JavaScript: every action is a plain form.

A session is a signed cookie (HMAC-SHA256); every POST that acts carries a CSRF token bound
to the session. A GET never changes anything: mail scanners open approval links (SPEC §6).
Pages render the pending request from the stored tool call and preview, never from the
model's prose, and every stored string goes through Jinja's autoescaping.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.requests import ClientDisconnect

from tether import inputs
from tether.api.deps import engine_of
from tether.engine import Engine
from tether.errors import (
    AlreadyResumed,
    Changed,
    GuardFailed,
    InvalidInput,
    NoLongerPermitted,
    NotFound,
    TetherError,
    UnknownOrExpired,
)
from tether.loop import hash_token
from tether.models.base import Message
from tether.resume import DECISIONS, ApprovalResult, hop
from tether.runs import Run, RunState, iso
from tether.store import Decision
from tether.users import DEMO_KEYS, user_for_key

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SESSION_COOKIE = "tether_session"
LOGIN_COOKIE = "tether_login"
SESSION_MAX_AGE_S = 12 * 3600
LOGIN_MAX_AGE_S = 3600
MAX_TOKEN_CHARS = 200
# The dev login ("Sign in as dana") exists only for the demo agent, whose users' keys are
# published in the README anyway; the name is the one tether.sandbox.agent gives it.
DEMO_AGENT = "sales-demo"
# How many open suspensions (soonest expiry first) the inbox considers; of those it shows
# the ones the viewer owns or may approve by the owner's scope now.
INBOX_LIMIT = 1000

# No scripts at all, no framing (clickjacking the Approve button), forms only to ourselves,
# and the token in an approval URL never leaves in a Referer.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}

router = APIRouter(include_in_schema=False)


# -- rendering ---------------------------------------------------------------------------


def show(value: Any) -> str:
    """A stored scalar or structure as text (autoescaped by the template)."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def when(epoch: float | None) -> str:
    """Epoch seconds of the database clock, for people."""
    stamp = iso(epoch)
    return stamp[:19].replace("T", " ") + " UTC" if stamp else "—"


def columns(rows: Sequence[Any]) -> list[str] | None:
    """The union of keys of a list of mappings, in first-seen order; None if the list
    holds anything else (it is then shown as a plain list)."""
    if not rows or not all(isinstance(row, Mapping) for row in rows):
        return None
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(str(key) for key in row))
    return list(seen)


def time_left(seconds: float) -> str:
    """What remains of an approval window, for people."""
    if seconds <= 0:
        return "expired"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["show"] = show
    env.filters["when"] = when
    env.globals["columns"] = columns
    return env


templates = Jinja2Templates(env=_environment())


def page(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    session: Session | None,
    status: int = 200,
) -> Response:
    """A rendered page with the security headers every page carries."""
    response = templates.TemplateResponse(
        request, name, {"session": session, **context}, status_code=status
    )
    response.headers.update(PAGE_HEADERS)
    return response


def message(
    request: Request,
    session: Session | None,
    status: int,
    title: str,
    text: str,
    *,
    kind: str = "info",
    sign_in: str | None = None,
) -> Response:
    """A page that only says something (a refusal, a missing page, a sign-in prompt)."""
    context = {"title": title, "text": text, "kind": kind, "sign_in": sign_in}
    return page(request, "message.html", context, session=session, status=status)


def unknown_or_expired(request: Request, session: Session | None) -> Response:
    """The one answer for a token that is unknown, expired, or not the viewer's to see: it
    never reveals whether the run exists."""
    return message(
        request,
        session,
        404,
        "Unknown or expired",
        "This approval link is unknown or has expired.",
        kind="refused",
    )


# -- sessions and CSRF -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Session:
    """A signed-in browser: the user, the session's random id, and its CSRF token."""

    user: str
    sid: str
    csrf: str


def _secret(request: Request) -> bytes:
    """``TETHER_SESSION_SECRET`` if set (needed when several processes serve the pages),
    otherwise a random secret of this app's process: a restart signs everyone out."""
    configured = os.environ.get("TETHER_SESSION_SECRET", "")
    if configured:
        return configured.encode()
    state = request.app.state
    if getattr(state, "web_session_secret", None) is None:
        state.web_session_secret = secrets.token_bytes(32)
    secret: bytes = state.web_session_secret
    return secret


def _mac(secret: bytes, purpose: str, text: str) -> str:
    return hmac.new(secret, f"{purpose}:{text}".encode(), hashlib.sha256).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _session_cookie(secret: bytes, user: str) -> str:
    body = json.dumps({"u": user, "s": secrets.token_urlsafe(18), "t": int(time.time())})
    payload = _b64(body.encode())
    return f"{payload}.{_mac(secret, 'session', payload)}"


def session_of(request: Request) -> Session | None:
    """The session the request's cookie proves, or None (missing, forged or too old)."""
    cookie = request.cookies.get(SESSION_COOKIE, "")
    payload, _, mac = cookie.partition(".")
    if not payload or len(cookie) > 1024:
        return None
    secret = _secret(request)
    if not hmac.compare_digest(mac, _mac(secret, "session", payload)):
        return None
    try:
        data = json.loads(_unb64(payload))
        user, sid, issued = str(data["u"]), str(data["s"]), int(data["t"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    if not 0 <= time.time() - issued < SESSION_MAX_AGE_S:
        return None
    return Session(user=user, sid=sid, csrf=_mac(secret, "csrf", sid))


async def posted(request: Request) -> Mapping[str, Any]:
    """The posted form; empty (so nothing acts) if the client hung up while sending it, as
    a browser does with the first of two quick submissions."""
    try:
        return await request.form()
    except ClientDisconnect:
        return {}


def _field(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def _acts(request: Request, session: Session | None, form: Mapping[str, Any]) -> bool:
    """Whether a POST may act: a session, its CSRF token, and not a cross-site request
    (``Sec-Fetch-Site``, where the browser sends it, as a second line of defence)."""
    if session is None:
        return False
    if request.headers.get("sec-fetch-site", "same-origin") == "cross-site":
        return False
    return hmac.compare_digest(_field(form, "csrf"), session.csrf)


def _set_cookie(request: Request, response: Response, name: str, value: str, **kw: Any) -> None:
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        **kw,
    )


def safe_next(target: str) -> str:
    """A local path to go to after signing in; anything else (another site) becomes ``/``."""
    if (
        not target.startswith("/")
        or target.startswith(("//", "/\\"))
        or len(target) > 2000
        or any(ord(c) < 0x21 or c == "\\" for c in target)
    ):
        return "/"
    return target


def login_url(target: str) -> str:
    return "/login?next=" + quote(safe_next(target), safe="/")


# -- sign in and out ---------------------------------------------------------------------


def dev_login_shown(engine: Engine) -> bool:
    """The "Sign in as dana / miguel" buttons appear only for the demo agent."""
    return engine.agent.name == DEMO_AGENT


def _login_page(
    request: Request, target: str, *, error: str | None = None, status: int = 200
) -> Response:
    """The sign-in form, with a fresh login nonce: its cookie and the form's token must
    match, so another site cannot sign a browser into its own account (login CSRF)."""
    nonce = secrets.token_urlsafe(18)
    context = {
        "next": safe_next(target),
        "csrf": _mac(_secret(request), "login", nonce),
        "error": error,
        "dev_users": sorted(DEMO_KEYS) if dev_login_shown(engine_of(request)) else [],
    }
    response = page(request, "login.html", context, session=session_of(request), status=status)
    _set_cookie(request, response, LOGIN_COOKIE, nonce, max_age=LOGIN_MAX_AGE_S, path="/login")
    return response


@router.get("/login")
async def login_form(request: Request, next: str = "/") -> Response:
    return _login_page(request, next)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await posted(request)
    target = safe_next(_field(form, "next") or "/")
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    expected = _mac(_secret(request), "login", nonce)
    if not nonce or not hmac.compare_digest(_field(form, "csrf"), expected):
        return _login_page(request, target, error="The form expired; please try again.", status=403)
    user = await _authenticate(engine_of(request), _field(form, "key"), _field(form, "dev_user"))
    if user is None:
        return _login_page(request, target, error="That key is not valid.", status=401)
    response = RedirectResponse(target, status_code=303)
    _set_cookie(
        request,
        response,
        SESSION_COOKIE,
        _session_cookie(_secret(request), user),
        max_age=SESSION_MAX_AGE_S,
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE, path="/login")
    log.info("signed in", extra={"action": "web_login", "user": user})
    return response


async def _authenticate(engine: Engine, key: str, dev_user: str) -> str | None:
    """The user of an API key; or, for the demo agent, a demo user, exactly as if their
    published key had been typed (so the dev login grants nothing the key does not)."""
    if dev_user:
        if not dev_login_shown(engine) or dev_user not in DEMO_KEYS:
            return None
        key = DEMO_KEYS[dev_user]
    user = await hop(user_for_key, engine.store, key.strip())
    if dev_user and user != dev_user:
        return None
    return user


@router.post("/logout")
async def logout(request: Request) -> Response:
    session = session_of(request)
    form = await posted(request)
    if not _acts(request, session, form):
        return message(request, session, 403, "Refused", "Sign out from the page's own button.")
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/static/tether.css")
async def stylesheet() -> FileResponse:
    return FileResponse(HERE / "static" / "tether.css", media_type="text/css")


# -- the inbox ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PendingView:
    """A suspended run as a page shows it: the stored request and its window."""

    run: Run
    mine: bool
    left: str


def pending_view(run: Run, viewer: str, now: float) -> PendingView | None:
    """The run's pending request as ``viewer`` sees it; None unless it is suspended and its
    window (judged by the database's clock, ``now``) is still open."""
    if run.state is not RunState.SUSPENDED or run.pending is None or run.expires_at is None:
        return None
    if run.expires_at <= now:
        return None
    return PendingView(run=run, mine=run.user_id == viewer, left=time_left(run.expires_at - now))


@router.get("/")
async def inbox(request: Request) -> Response:
    session = session_of(request)
    if session is None:
        return RedirectResponse(login_url("/"), status_code=303)
    engine = engine_of(request)
    runs, now = await hop(engine.store.open_suspensions, INBOX_LIMIT)
    items = await _decidable(engine, runs, session.user, now)
    return page(request, "inbox.html", {"items": items}, session=session)


async def _decidable(engine: Engine, runs: list[Run], user: str, now: float) -> list[PendingView]:
    """The suspended runs ``user`` owns or may approve, still inside their window."""
    allowed: dict[str, bool] = {user: True}
    items = []
    for run in runs:
        view = pending_view(run, user, now)
        if view is None:
            continue
        if run.user_id not in allowed:
            allowed[run.user_id] = await _may_decide(engine, run.user_id, user)
        if allowed[run.user_id]:
            items.append(view)
    return items


async def _may_decide(engine: Engine, owner: str, viewer: str) -> bool:
    """Whether ``viewer`` may decide ``owner``'s pending calls, by the owner's scope now.
    A scope that cannot be resolved allows nobody but the owner."""
    if owner == viewer:
        return True
    try:
        scope = await engine.agent.resolve_scope(owner)
    except TetherError as exc:
        log.warning("scope unavailable", extra={"action": "web_scope", "error": exc.code})
        return False
    return scope.may_approve(viewer)


# -- approval links ----------------------------------------------------------------------


def _lookup(engine: Engine, token: str) -> tuple[Run | None, Decision | None, float]:
    run, used = engine.store.find_by_token(hash_token(token))
    return run, used, engine.store.now()


@router.get("/approve/{token}")
async def approval_page(request: Request, token: str) -> Response:
    """Shows the request behind an approval link. Never changes anything."""
    session = session_of(request)
    if session is None:
        return message(
            request,
            None,
            200,
            "Sign in to review this request",
            "This is an approval link. Sign in to see the request and decide it.",
            sign_in=login_url(f"/approve/{token}"),
        )
    engine = engine_of(request)
    if not token or len(token) > MAX_TOKEN_CHARS:
        return unknown_or_expired(request, session)
    run, used, now = await hop(_lookup, engine, token)
    view = pending_view(run, session.user, now) if run is not None else None
    if view is not None:
        if await _may_decide(engine, view.run.user_id, session.user):
            context = {"item": view, "token": token}
            return page(request, "approve.html", context, session=session)
    elif used is not None:
        decided = await hop(engine.store.get_run, used.run_id)
        if decided is not None and await _may_decide(engine, decided.user_id, session.user):
            return outcome(
                request, session, 200, "already_resumed", decision=_decision(used), run=decided
            )
    return unknown_or_expired(request, session)


def _decision(used: Decision) -> dict[str, Any]:
    return {"decision": used.decision, "by": used.by, "at": when(used.at)}


@router.post("/approve/{token}")
async def decide(request: Request, token: str) -> Response:
    """Acts on an approval link: only a signed-in user's POST with the session's CSRF token.
    The engine claims first, so a double submission resumes once."""
    session = session_of(request)
    form = await posted(request)
    if session is None:
        return message(
            request,
            None,
            403,
            "Sign in first",
            "Nothing was decided: sign in, then decide from the request's page.",
            kind="refused",
            sign_in=login_url(f"/approve/{token}"),
        )
    if not _acts(request, session, form):
        return _not_from_this_session(request, session)
    decision = _field(form, "decision")
    if decision not in DECISIONS:
        return _invalid_decision(request, session)
    engine = engine_of(request)
    return await _carry_out(
        request, session, engine.resume_after_confirmation(token, decision, session.user)
    )


def _not_from_this_session(request: Request, session: Session) -> Response:
    return message(
        request,
        session,
        403,
        "Refused",
        "Nothing was decided: this form was not sent from your own session's page.",
        kind="refused",
    )


def _invalid_decision(request: Request, session: Session) -> Response:
    return message(
        request, session, 422, "Invalid decision", "Choose approve or decline.", kind="refused"
    )


@router.post("/runs/{run_id}/decision")
async def decide_from_inbox(request: Request, run_id: str) -> Response:
    """Acts from the inbox, which has no token: the form names the call and the preview
    digest the user was shown; same CSRF rule, same claim, same outcomes."""
    session = session_of(request)
    form = await posted(request)
    if session is None:
        return RedirectResponse(login_url("/"), status_code=303)
    if not _acts(request, session, form):
        return _not_from_this_session(request, session)
    decision = _field(form, "decision")
    call, shown = _field(form, "tool_call_id"), _field(form, "digest")
    if decision not in DECISIONS or not call or not inputs.RUN_ID.fullmatch(run_id):
        return _invalid_decision(request, session)
    engine = engine_of(request)
    return await _carry_out(
        request,
        session,
        engine.resume_by_run(
            run_id, decision, session.user, tool_call_id=call, digest=shown or None
        ),
    )


async def _carry_out(
    request: Request, session: Session, deciding: Awaitable[ApprovalResult]
) -> Response:
    engine = engine_of(request)
    try:
        result = await deciding
    except AlreadyResumed as exc:
        used = exc.details.get("decision") or {}
        decided = {
            "decision": used.get("decision"),
            "by": used.get("by"),
            "at": _iso_for_people(used.get("at")),
        }
        return outcome(request, session, 409, "already_resumed", decision=decided, run=None)
    except Changed as exc:
        return await _changed(request, session, exc)
    except GuardFailed as exc:
        reason = str(exc.details.get("reason") or exc.message)
        return outcome(request, session, 409, "guard_failed", reason=reason)
    except NoLongerPermitted as exc:
        return outcome(request, session, 403, "no_longer_permitted", reason=exc.message)
    except UnknownOrExpired:
        return unknown_or_expired(request, session)
    except InvalidInput as exc:
        return message(request, session, 422, "Invalid", exc.message, kind="refused")
    log.info(
        "decided on the web",
        extra={"run_id": result.run_id, "action": "web_decision", "state": result.state},
    )
    owner = await _owner(engine, result.run_id)
    return outcome(request, session, 200, "done", result=result, owner=owner)


def outcome(request: Request, session: Session, status: int, kind: str, **context: Any) -> Response:
    """The page that reports what became of a decision (or why there was none)."""
    return page(
        request, "outcome.html", {"outcome": kind, **context}, session=session, status=status
    )


async def _owner(engine: Engine, run_id: str) -> str | None:
    run = await hop(engine.store.get_run, run_id)
    return run.user_id if run else None


def _iso_for_people(stamp: Any) -> str:
    return str(stamp)[:19].replace("T", " ") + " UTC" if stamp else "—"


async def _changed(request: Request, session: Session, exc: Changed) -> Response:
    """The diff side by side, and the new request (from the store, by its new token) with
    its own Approve / Decline form."""
    engine = engine_of(request)
    new_token = str(exc.details.get("token") or "")
    item = None
    if new_token:
        run, _, now = await hop(_lookup, engine, new_token)
        item = pending_view(run, session.user, now) if run is not None else None
    diff = list(exc.details.get("diff") or [])
    return outcome(request, session, 409, "changed", diff=diff, item=item, token=new_token)


# -- a run -------------------------------------------------------------------------------


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str) -> Response:
    """A run for its owner: state, budget, pending request, timeline and messages."""
    session = session_of(request)
    if session is None:
        return RedirectResponse(login_url(f"/runs/{run_id}"), status_code=303)
    engine = engine_of(request)
    try:
        view = await engine.get_run(run_id, user_id=session.user)
    except NotFound:
        return message(request, session, 404, "Not found", "There is no such run.", kind="refused")
    events = await engine.events(run_id)
    run = view.run
    pending = None
    if run.state is RunState.SUSPENDED:
        pending = pending_view(run, session.user, await hop(engine.store.now))
    context: dict[str, Any] = {
        "run": run,
        "pending": pending,
        "budget": _budget_rows(run),
        "events": [{"at": e.at, "kind": e.kind, "data": _summary(e.data)} for e in events],
        "messages": [_message_view(m) for m in view.messages],
    }
    return page(request, "run.html", context, session=session)


def _budget_rows(run: Run) -> list[tuple[str, Any, Any]]:
    limits, used = run.limits, run.budget
    return [
        ("steps", used.steps, limits.max_steps),
        ("spend (USD)", f"{used.spend_usd:.4f}", f"{limits.max_spend_usd:.4f}"),
        ("tool calls", used.tool_calls, limits.max_tool_calls),
        ("active time (ms)", used.elapsed_ms, limits.max_elapsed_ms),
    ]


def _summary(data: Mapping[str, Any], limit: int = 240) -> str:
    text = json.dumps(data, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
