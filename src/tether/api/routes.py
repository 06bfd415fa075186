"""What every router of the JSON API shares: the bearer scheme its OpenAPI document
names, the caller and engine dependencies, and how a route documents its refusals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Security
from fastapi.security import HTTPBearer

from tether.api.bodies import BoundedJsonRoute
from tether.api.deps import api_user, engine_of
from tether.api.schemas import ErrorOut
from tether.engine import Engine

# Documents the scheme in the OpenAPI document; `api_user` does the checking.
_bearer = HTTPBearer(
    auto_error=False, description="An API key of the caller: `Authorization: Bearer API_KEY`."
)

Caller = Annotated[str, Depends(api_user)]
EngineDep = Annotated[Engine, Depends(engine_of)]

AUTH = "`unauthenticated`: no or an unknown API key"
TOO_LARGE = "`payload_too_large`: the body is over 256 KiB"
INVALID = "`invalid_input`: the body or a parameter is malformed; nothing was changed"


def json_router() -> APIRouter:
    """A router of the JSON API: bearer-authenticated, its bodies read by the bounded
    JSON reader."""
    return APIRouter(dependencies=[Security(_bearer)], route_class=BoundedJsonRoute)


def responses(*pairs: tuple[int, str], model: type[ErrorOut] = ErrorOut) -> dict[int | str, Any]:
    """The OpenAPI ``responses`` of a route's refusals: (status, what it means) pairs."""
    return {status: {"model": model, "description": text} for status, text in pairs}
