"""Request dependencies shared by the JSON API and the inbox: the engine and the caller."""

from __future__ import annotations

from fastapi import Request

from tether.engine import Engine
from tether.errors import Unauthenticated


def engine_of(request: Request) -> Engine:
    """The engine the app serves."""
    engine: Engine = request.app.state.engine
    return engine


async def api_user(request: Request) -> str:
    """The user of ``Authorization: Bearer API_KEY``; 401 ``unauthenticated`` otherwise."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("send Authorization: Bearer API_KEY")
    user = await engine_of(request).user_for_key(key.strip())
    if user is None:
        raise Unauthenticated("unknown API key")
    return user
