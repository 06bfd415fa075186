"""``create_app``: the sandbox CRM as a FastAPI app over its own SQLite file.

Every error, including FastAPI's own validation and routing errors, answers
``{"ok": false, "error": CODE, "message": TEXT}`` so clients match on one shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.demo.sandbox import admin, routes
from tether.demo.sandbox.db import SandboxStore
from tether.demo.sandbox.errors import SandboxError, error_body
from tether.demo.sandbox.failures import FailureInjector, FailureMiddleware

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def create_app(db_path: str) -> FastAPI:
    """The sandbox app; its database at ``db_path`` is opened (and seeded if new) at startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await asyncio.to_thread(SandboxStore.open, db_path)
        app.state.store = store
        try:
            yield
        finally:
            store.close()

    app = FastAPI(title="tether sandbox CRM", lifespan=lifespan)
    injector = FailureInjector()
    app.state.failures = injector
    app.include_router(routes.router)
    app.include_router(admin.router)
    app.add_exception_handler(SandboxError, _sandbox_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(FailureMiddleware, injector=injector, routes=app.router.routes)
    return app


async def _sandbox_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SandboxError)
    return JSONResponse(exc.to_dict(), status_code=exc.status)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    for error in errors:
        if error.get("type") == "json_invalid":
            reason = error.get("ctx", {}).get("error", "malformed")
            message = f"request body is not valid JSON: {reason}"
            return JSONResponse(error_body("invalid_json", message), status_code=422)
    return JSONResponse(error_body("invalid_request", _describe(errors)), status_code=422)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = f"{exc.detail}: {request.method} {request.url.path}"
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)


def _describe(errors: Sequence[Any]) -> str:
    """Pydantic's errors as one line: ``body.quantity: Input should be greater than 0``."""
    parts = []
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ()))
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"
