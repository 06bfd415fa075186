"""The FastAPI application: the JSON API under /v1, the approvals inbox, health and
metrics. Every 4xx body is ``{"ok": false, "error": CODE, "message": TEXT}`` (reference §6)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.api.attempts import AuthAttempts
from tether.api.headers import SecurityHeaders
from tether.api.statuses import error_body, status_for
from tether.api.stream_slots import StreamSlots
from tether.engine import Engine
from tether.errors import NotReady, TetherError, TooManyAttempts
from tether.telemetry.content import failure

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024
BODY_TIMEOUT_S = 30.0


class BodyLimit:
    """Refuses request bodies larger than ``limit`` bytes with a 413, whether the size is
    declared (Content-Length) or only discovered while reading a chunked body, and bodies
    still incomplete ``timeout_s`` after the app began reading them with a 408 (a client
    sending a byte a second would otherwise hold its request, and a graceful shutdown,
    for as long as it likes); the handler never sees such a body."""

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _too_large(self.limit)(scope, receive, send)
            return
        seen = 0
        refused = False
        deadline: float | None = None  # set by the app's first read
        body_done = False

        async def limited() -> Message:
            nonlocal seen, refused, deadline, body_done
            if body_done:  # once the body is in, receive() waits for a disconnect: unbounded
                return await receive()
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except TimeoutError:
                if not refused:
                    refused = True
                    await _too_slow(self.timeout_s)(scope, receive, send)
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                body_done = not message.get("more_body", False)
                seen += len(message.get("body", b""))
                if seen > self.limit and not refused:
                    refused = True
                    await _too_large(self.limit)(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:  # once refused, the app's own answer is dropped
                await send(message)

        try:
            await self.app(scope, limited, guarded_send)
        except Exception:
            if not refused:
                raise


class NulInUrl:
    """Refuses a request whose path, query or headers hold a NUL character (``%00``) with
    a ``422 invalid_input``, before any route reads them: no id, parameter or header
    carries one further (JSON bodies are checked by their one reader, ``inputs.json_value``,
    and everything the engine is handed by ``inputs.storable``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _holds_nul(scope):
            body = error_body("invalid_input", "the URL and headers must not contain NUL")
            response = JSONResponse(body, status_code=status_for("invalid_input"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _holds_nul(scope: Scope) -> bool:
    query: bytes = scope.get("query_string", b"")
    return (
        "\x00" in scope.get("path", "")
        or b"%00" in query
        or b"\x00" in query
        or any(b"\x00" in value for _, value in scope.get("headers") or ())
    )


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        error_body("payload_too_large", f"request bodies are limited to {limit} bytes"),
        status_code=status_for("payload_too_large"),
    )


def _too_slow(timeout_s: float) -> JSONResponse:
    return JSONResponse(
        error_body("request_timeout", f"the request body did not arrive within {timeout_s:g}s"),
        status_code=status_for("request_timeout"),
        headers={"connection": "close"},
    )


def _fastapi() -> FastAPI:
    """The bare app. FastAPI's Swagger UI and ReDoc pages load their scripts from a CDN:
    ``/docs`` is a page of our own instead (``tether.api.web.apidocs``), rendered from
    ``/openapi.json`` with no script."""
    return FastAPI(
        title="tether",
        version="0.1.0",
        summary="Agent runs that survive interruption",
        docs_url=None,
        redoc_url=None,
    )


def _set_up(app: FastAPI, engine: Engine, public_url: str) -> None:
    """What every request of ``app`` shares: the engine, the counts of failed
    authentications and open streams, and the middleware that guards each request."""
    app.state.engine = engine
    app.state.public_url = public_url.rstrip("/")
    # Set by the process that serves the app when a part it depends on stopped (serve's
    # worker): /readyz then answers 503 while the process shuts down.
    app.state.unready = None
    app.state.auth_attempts = AuthAttempts(
        engine.settings.auth_max_failures, engine.settings.auth_window_s
    )
    app.state.stream_slots = StreamSlots(engine.settings.max_streams_per_user)
    app.add_middleware(BodyLimit, timeout_s=engine.settings.http_body_timeout_s)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(NulInUrl)


def create_app(engine: Engine, *, public_url: str = "") -> FastAPI:
    """The app for ``engine``. ``public_url`` prefixes approval links in notices."""
    from tether.api import approvals, audit, metrics, schedules, threads, trees, users, v1, web

    app = _fastapi()
    _set_up(app, engine, public_url)

    @app.exception_handler(TetherError)
    async def tether_error(_: Request, exc: TetherError) -> JSONResponse:
        status = status_for(exc.code)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, TooManyAttempts):
            headers = {"Retry-After": str(exc.details["retry_after_s"])}
        return JSONResponse(exc.to_dict(), status_code=status, headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        told = failure(exc, engine.settings.log_content, action="http", path=request.url.path)
        log.error("request failed", **told)
        body = error_body("internal_error", "an internal error occurred")
        return JSONResponse(body, status_for("internal_error"))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            for err in exc.errors()
        )
        body = error_body("invalid_input", problems or "invalid input")
        return JSONResponse(body, status_for("invalid_input"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthenticated"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> dict[str, bool]:
        if app.state.unready:
            raise NotReady(app.state.unready)
        await engine.operator.ready()  # NotReady (503 not_ready) when the database is unreachable
        return {"ok": True}

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> PlainTextResponse:
        body, content_type = await metrics.render(engine)
        return PlainTextResponse(body, media_type=content_type)

    app.include_router(v1.router, prefix="/v1")
    app.include_router(approvals.router, prefix="/v1")
    app.include_router(audit.router, prefix="/v1")
    app.include_router(threads.router, prefix="/v1")
    app.include_router(schedules.router, prefix="/v1")
    app.include_router(trees.router, prefix="/v1")
    app.include_router(users.router, prefix="/v1")
    app.include_router(web.router)
    return app
