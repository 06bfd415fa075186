"""Request dependencies shared by the JSON API and the inbox: the engine and the caller."""

from __future__ import annotations

from fastapi import Request

from tether.api.attempts import AuthAttempts
from tether.api.stream_slots import StreamSlots
from tether.engine import Engine
from tether.errors import Unauthenticated


def engine_of(request: Request) -> Engine:
    """The engine the app serves."""
    engine: Engine = request.app.state.engine
    return engine


def attempts_of(request: Request) -> AuthAttempts:
    """The app's counts of failed authentications (``tether.api.attempts``)."""
    attempts: AuthAttempts = request.app.state.auth_attempts
    return attempts


def stream_slots_of(request: Request) -> StreamSlots:
    """The app's open event streams per user (``tether.api.stream_slots``)."""
    slots: StreamSlots = request.app.state.stream_slots
    return slots


def address_of(request: Request) -> str:
    """The client's address: the connection's peer, or the client a proxy listed in
    ``TETHER_TRUSTED_PROXIES`` names in ``X-Forwarded-For`` (``api.server``; tether reads
    no forwarding header itself)."""
    return request.client.host if request.client else "unknown"


async def api_user(request: Request) -> str:
    """The user of ``Authorization: Bearer API_KEY``; 401 ``unauthenticated`` otherwise.
    429 ``too_many_attempts`` for a key that failed too often lately (checked before it is
    looked up), and for a failed key from an address past its failures; a valid key is
    never refused for others' failures (``tether.api.attempts``)."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("send Authorization: Bearer API_KEY")
    attempts = attempts_of(request)
    attempts.check(key.strip())
    user = await engine_of(request).web.user_for_key(key.strip())
    if user is None:
        refused = attempts.failed(address_of(request), key.strip())
        raise refused or Unauthenticated("unknown API key")
    return user
