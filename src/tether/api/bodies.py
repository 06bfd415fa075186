"""JSON request bodies read by the one bounded JSON reader (``tether.inputs.json_value``),
for every route of the JSON API: a body that is not JSON, or nested deeper than
``MAX_JSON_DEPTH``, is a 422 ``invalid_input`` that says so, and never reaches the
parser's recursion limit. The inbox's forms read their JSON fields with the same reader."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from tether import inputs


class BoundedJsonRoute(APIRoute):
    """A route whose JSON body is read, before FastAPI sees it, by the bounded reader. Its
    ``invalid_input`` reaches the app's error handler like any engine error."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            body = await request.body()
            if body and _is_json(request.headers.get("content-type")):
                # Starlette's Request.json() returns this once set: FastAPI reads it there.
                request._json = inputs.json_value(body, "the request body")
            return await handler(request)

        return bounded


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI would read a body of this type as JSON (none given counts)."""
    if not content_type:
        return True
    kind = content_type.partition(";")[0].strip().lower()
    major, _, minor = kind.partition("/")
    return major == "application" and (minor == "json" or minor.endswith("+json"))
