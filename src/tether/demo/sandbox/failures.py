"""One-shot failures injected per route, so tests can crash a write at a chosen moment.

``POST /admin/failures {"route": "POST /quotes", "kind": "crash_after_commit"}`` arms one
failure; the next request whose method and route template match fires it and disarms it.
The sandbox itself keeps serving: only that one response is replaced with a 500.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from enum import StrEnum

from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.demo.sandbox.errors import error_body

log = logging.getLogger(__name__)


class FailureKind(StrEnum):
    """How an injected failure fires; the values are what ``POST /admin/failures`` takes."""

    CRASH_AFTER_COMMIT = "crash_after_commit"  # the request runs and commits, then answers 500
    FAIL_BEFORE_COMMIT = "fail_before_commit"  # answers 500 without running the request


class FailureInjector:
    """Armed one-shot failures keyed by ``"METHOD /route/{template}"``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, deque[FailureKind]] = {}

    def arm(self, route: str, kind: FailureKind) -> int:
        """Queue one failure for ``route``; returns how many are now armed for it."""
        with self._lock:
            queue = self._armed.setdefault(route, deque())
            queue.append(kind)
            return len(queue)

    def take(self, route: str) -> FailureKind | None:
        """Disarm and return the next failure for ``route``, if any."""
        with self._lock:
            queue = self._armed.get(route)
            if not queue:
                return None
            kind = queue.popleft()
            if not queue:
                del self._armed[route]
            return kind

    def any_armed(self) -> bool:
        """Whether any failure is armed (the fast path skips route matching otherwise)."""
        with self._lock:
            return bool(self._armed)

    def clear(self) -> None:
        """Disarm everything."""
        with self._lock:
            self._armed.clear()


def route_keys(routes: Iterable[BaseRoute]) -> set[str]:
    """Every ``"METHOD /template"`` the app serves: the valid targets of a failure."""
    return {
        f"{method} {route.path}"
        for route in routes
        if isinstance(route, Route)
        for method in route.methods or ()
    }


def _route_key(scope: Scope, routes: Sequence[BaseRoute]) -> str | None:
    for route in routes:
        if isinstance(route, Route) and route.matches(scope)[0] is Match.FULL:
            return f"{scope['method']} {route.path}"
    return None


class FailureMiddleware:
    """ASGI middleware that fires an armed failure on the next request to its route."""

    def __init__(
        self, app: ASGIApp, *, injector: FailureInjector, routes: Sequence[BaseRoute]
    ) -> None:
        self.app = app
        self.injector = injector
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.injector.any_armed():
            await self.app(scope, receive, send)
            return
        route = _route_key(scope, self.routes)
        kind = None if route is None else self.injector.take(route)
        if kind is None:
            await self.app(scope, receive, send)
            return
        if kind is FailureKind.CRASH_AFTER_COMMIT:
            # The handler runs to completion (its transaction commits); its answer is lost.
            await self.app(scope, receive, _discard)
        log.warning("injected failure fired", extra={"route": route, "kind": str(kind)})
        body = error_body("injected_failure", f"injected {kind} on {route}")
        await JSONResponse(body, status_code=500)(scope, receive, send)


async def _discard(message: Message) -> None:
    """An ASGI ``send`` that drops the response."""
