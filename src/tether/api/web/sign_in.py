"""Signing in and out of the inbox: a session is a signed cookie (HMAC-SHA256) naming a
server-side session (``WebSide.sign_in``), checked on every use, so signing out or
removing the key that opened it ends it at once. Every POST that acts carries a CSRF token
bound to the session. The sign-in form has its own nonce, so another site cannot sign a
browser into its account (login CSRF)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.requests import ClientDisconnect

from tether import inputs
from tether.api.deps import address_of, attempts_of, engine_of
from tether.api.web.pages import ASSETS, message, not_from_this_session, page
from tether.engine import Engine
from tether.errors import InvalidInput, TooManyAttempts

log = logging.getLogger(__name__)

SESSION_COOKIE = "tether_session"
LOGIN_COOKIE = "tether_login"
SESSION_MAX_AGE_S = 12 * 3600
LOGIN_MAX_AGE_S = 3600

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True, kw_only=True)
class SignIn:
    """A signed-in browser: the user, the session's random id, and its CSRF token."""

    user: str
    sid: str
    csrf: str


# -- signing -----------------------------------------------------------------------------


def _secret(request: Request) -> bytes:
    """``Settings.session_secret`` if set (needed when several processes serve the pages),
    otherwise a random secret of this app's process: a restart signs everyone out."""
    configured = engine_of(request).settings.session_secret
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


def _session_cookie(secret: bytes, user: str, sid: str) -> str:
    body = json.dumps({"u": user, "s": sid, "t": int(time.time())})
    payload = _b64(body.encode())
    return f"{payload}.{_mac(secret, 'session', payload)}"


async def sign_in_of(request: Request) -> SignIn | None:
    """The session the request's cookie proves, or None (missing, forged, too old, signed
    out, or its key removed)."""
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
    if await engine_of(request).web.signed_in_user(sid) != user:
        return None
    return SignIn(user=user, sid=sid, csrf=_mac(secret, "csrf", sid))


# -- forms -------------------------------------------------------------------------------


async def posted(request: Request) -> Mapping[str, Any]:
    """The posted form; empty (so nothing acts) if the client hung up while sending it, as
    a browser does with the first of two quick submissions. ``invalid_input`` when a
    field's name or text holds a NUL character or a lone surrogate (``inputs.storable``)."""
    try:
        form = await request.form()
    except ClientDisconnect:
        return {}
    for name, value in form.multi_items():
        inputs.storable(name, "the name of a form field")
        inputs.storable(value if isinstance(value, str) else "", f"the form's {name}")
    return form


def field(form: Mapping[str, Any], name: str) -> str:
    """A text field of ``form``; empty when missing or not text."""
    value = form.get(name)
    return value if isinstance(value, str) else ""


def acts(request: Request, session: SignIn | None, form: Mapping[str, Any]) -> bool:
    """Whether a POST may act: a session, its CSRF token, and not a cross-site request
    (``Sec-Fetch-Site``, where the browser sends it, as a second line of defence)."""
    if session is None:
        return False
    if request.headers.get("sec-fetch-site", "same-origin") == "cross-site":
        return False
    return hmac.compare_digest(field(form, "csrf"), session.csrf)


async def acting(
    request: Request, signed_out: Callable[[], Response]
) -> tuple[SignIn, Mapping[str, Any]] | Response:
    """The session and posted form of a POST that may act (:func:`acts`), or the answer
    to give instead: ``signed_out()`` without a session, a refusal (403, nothing done)
    for a form not sent from the session's own page. Every acting form starts here."""
    session = await sign_in_of(request)
    try:
        form = await posted(request)
    except InvalidInput as exc:
        if session is None:
            return signed_out()
        return message(request, session, 422, "Invalid", exc.message, kind="refused")
    if session is None:
        return signed_out()
    if not acts(request, session, form):
        return not_from_this_session(request, session)
    return session, form


def back_to(path: str) -> Callable[[], Response]:
    """Send a signed-out visitor to sign in, then back to ``path``."""
    return lambda: RedirectResponse(login_url(path), status_code=303)


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
    """The sign-in page, coming back to ``target`` (a local path) afterwards."""
    return "/login?next=" + quote(safe_next(target), safe="/")


# -- sign in and out ---------------------------------------------------------------------


async def _login_page(
    request: Request, target: str, *, error: str | None = None, status: int = 200
) -> Response:
    """The sign-in form, with a fresh login nonce: its cookie and the form's token must
    match. The agent's published users (``Agent.users``) get one-click buttons."""
    nonce = secrets.token_urlsafe(18)
    context = {
        "next": safe_next(target),
        "csrf": _mac(_secret(request), "login", nonce),
        "error": error,
        "dev_users": sorted(engine_of(request).agent.users),
    }
    response = page(
        request, "login.html", context, session=await sign_in_of(request), status=status
    )
    _set_cookie(request, response, LOGIN_COOKIE, nonce, max_age=LOGIN_MAX_AGE_S, path="/login")
    return response


@router.get("/login")
async def login_form(request: Request, next: str = "/") -> Response:
    return await _login_page(request, next)


@router.post("/login")
async def login(request: Request) -> Response:
    try:
        form = await posted(request)
    except InvalidInput as exc:
        return await _login_page(request, "/", error=exc.message, status=422)
    target = safe_next(field(form, "next") or "/")
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    expected = _mac(_secret(request), "login", nonce)
    if not nonce or not hmac.compare_digest(field(form, "csrf"), expected):
        return await _login_page(
            request, target, error="The form expired; please try again.", status=403
        )
    key, dev_user = field(form, "key"), field(form, "dev_user")
    attempts = attempts_of(request)
    credential = f"published:{dev_user}" if dev_user else key.strip()
    try:
        attempts.check(credential)  # only this credential's failures count here
    except TooManyAttempts as exc:
        return await _too_many(request, target, exc)
    opened = await _authenticate(engine_of(request), key, dev_user)
    if opened is None:
        over = attempts.failed(address_of(request), credential)
        if over is not None:
            return await _too_many(request, target, over)
        return await _login_page(request, target, error="That key is not valid.", status=401)
    user, sid = opened
    response = RedirectResponse(target, status_code=303)
    _set_cookie(
        request,
        response,
        SESSION_COOKIE,
        _session_cookie(_secret(request), user, sid),
        max_age=SESSION_MAX_AGE_S,
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE, path="/login")
    log.info("signed in", extra={"action": "web_login", "user": user})
    return response


async def _too_many(request: Request, target: str, exc: TooManyAttempts) -> Response:
    refused = await _login_page(request, target, error=exc.message, status=429)
    refused.headers["Retry-After"] = str(exc.details["retry_after_s"])
    return refused


async def _authenticate(engine: Engine, key: str, dev_user: str) -> tuple[str, str] | None:
    """A new session (user, session id) of an API key; or of one of the agent's published
    users, exactly as if their published key had been typed (so the button grants nothing
    the key does not)."""
    if dev_user:
        published = engine.agent.users.get(dev_user)
        if published is None:
            return None
        key = published
    opened = await engine.web.sign_in(key.strip(), SESSION_MAX_AGE_S)
    if opened is not None and dev_user and opened[0] != dev_user:
        await engine.web.sign_out(opened[1])
        return None
    return opened


@router.post("/logout")
async def logout(request: Request) -> Response:
    session = await sign_in_of(request)
    try:
        form = await posted(request)
    except InvalidInput as exc:
        return message(request, session, 422, "Invalid", exc.message, kind="refused")
    if not acts(request, session, form):
        return message(request, session, 403, "Refused", "Sign out from the page's own button.")
    if session is not None:  # always, once acts() agreed
        await engine_of(request).web.sign_out(session.sid)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/static/tether.css")
async def stylesheet() -> FileResponse:
    return FileResponse(ASSETS / "static" / "tether.css", media_type="text/css")
