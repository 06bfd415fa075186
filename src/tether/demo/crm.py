"""The demo agent's dependency: a client of the sandbox CRM, handed to every tool call as
``ctx.deps`` (``Agent(deps=Crm(...))``), never found in globals or the environment.

Errors are mapped for crash safety (reference invariant 3): a 4xx means the CRM refused and
nothing happened (``ToolFailed``); a timeout, a dropped connection or a 5xx on a write may
have committed (``OutcomeUnknown``), so tether reconciles it by key before going on.

HTTPX and the TLS context are made on the first call, not on import: a command that loads
the demo agent but calls no tool (``tether runs list``) does not pay for them.
"""

from __future__ import annotations

import functools
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tether import OutcomeUnknown, Reconciled, ToolContext, ToolFailed
from tether.errors import TetherError

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

# Where ``tether sandbox serve`` listens by default.
DEFAULT_SANDBOX_URL = "http://127.0.0.1:8100"
USER_HEADER = "X-Sandbox-User"
IDEMPOTENCY_HEADER = "Idempotency-Key"


@functools.cache
def tls() -> ssl.SSLContext:
    """One TLS context for every client (httpx builds a new one per client otherwise)."""
    return ssl.create_default_context()


@functools.cache
def no_tls() -> ssl.SSLContext:
    """The context of a client of a plain ``http://`` CRM, which never uses one (httpx
    follows no redirect unless asked): it trusts no certificate, so a TLS connection would
    fail rather than go unchecked, and it loads no CA bundle (30 ms of CPU a command)."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class SandboxUnavailable(TetherError):
    """The sandbox CRM could not be reached to resolve a user's scope. Its message reaches
    API callers, so it says only that; the CRM's address and error go to the log."""

    code = "sandbox_unavailable"


UNREACHABLE = "the business system (the CRM) is unreachable; try again later"


@dataclass(frozen=True, kw_only=True)
class Crm:
    """Where the sandbox CRM answers. ``base_url=None`` means none was configured: the
    demo agent's lifespan then starts one in-process (calls made outside it go to
    ``DEFAULT_SANDBOX_URL``)."""

    base_url: str | None = None
    timeout_s: float = 10.0

    @property
    def url(self) -> str:
        """The base URL the calls go to."""
        return (self.base_url or DEFAULT_SANDBOX_URL).rstrip("/")

    def _client(self) -> httpx.AsyncClient:
        # A client per call: the engine calls tools from more than one event loop (a
        # thread's ``asyncio.run``), and a pooled client belongs to the loop it started on.
        # The TLS context is shared: building one costs tens of milliseconds of CPU.
        import httpx

        verify = tls() if self.url.startswith("https:") else no_tls()
        return httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, verify=verify)

    async def call(
        self,
        method: str,
        path: str,
        *,
        user: str,
        key: str | None = None,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One request to the CRM as ``user``. With ``key`` it is a write: an ambiguous
        failure raises ``OutcomeUnknown``; every other failure raises ``ToolFailed``."""
        import httpx

        headers = {USER_HEADER: user}
        if key is not None:
            headers[IDEMPOTENCY_HEADER] = key
        what = f"{method} {path}"
        try:
            async with self._client() as client:
                response = await client.request(
                    method, path, headers=headers, params=params, json=body
                )
        except httpx.HTTPError as exc:
            if key is not None:
                raise OutcomeUnknown(f"{what}: no answer from the CRM ({exc!r})") from exc
            raise ToolFailed(f"{what}: the CRM could not be reached ({exc!r})") from exc
        if response.status_code >= 500 and key is not None:
            raise OutcomeUnknown(f"{what}: the CRM answered {response.status_code}")
        if response.is_error:
            raise ToolFailed(f"{what}: {error_message(response)}", status=response.status_code)
        data: dict[str, Any] = response.json()
        return data

    async def write_by_key(self, key: str, user: str) -> Reconciled | dict[str, Any]:
        """The CRM's record of the write made with idempotency ``key`` (what reconcile
        asks), or ``Reconciled`` when it is absent or cannot be told."""
        import httpx

        try:
            async with self._client() as client:
                response = await client.get(
                    f"/quotes/by-key/{quote(key, safe='')}", headers={USER_HEADER: user}
                )
        except httpx.HTTPError as exc:
            return Reconciled.unreachable(f"the CRM could not be reached: {exc!r}")
        if response.status_code == 404:
            return Reconciled.absent()
        if response.status_code >= 500:
            return Reconciled.unreachable(f"the CRM answered {response.status_code}")
        if response.is_error:
            return Reconciled.unknown(f"the CRM answered {response.status_code}")
        record: dict[str, Any] = response.json()
        return record

    async def permissions(self, user_id: str) -> dict[str, Any] | None:
        """The user's permissions in the CRM now, or None for a user it does not know."""
        import httpx

        path = f"/users/{quote(user_id, safe='')}/permissions"
        try:
            async with self._client() as client:
                response = await client.get(path)
        except httpx.HTTPError as exc:
            log.warning(
                "cannot reach the CRM to resolve a scope",
                extra={"action": "scope", "url": f"{self.url}{path}", "error": repr(exc)[:500]},
            )
            raise SandboxUnavailable(UNREACHABLE) from exc
        if response.status_code == 404:
            return None
        if response.is_error:
            log.warning(
                "the CRM refused a scope lookup",
                extra={
                    "action": "scope",
                    "url": f"{self.url}{path}",
                    "error": error_message(response),
                },
            )
            raise SandboxUnavailable(UNREACHABLE)
        found: dict[str, Any] = response.json()
        return found


def crm_of(ctx: ToolContext) -> Crm:
    """The CRM a tool call is to use: the agent's ``deps``."""
    if not isinstance(ctx.deps, Crm):
        raise ToolFailed(
            f"the demo's tools need Agent(deps=Crm(...)), got {type(ctx.deps).__name__}"
        )
    return ctx.deps


def error_message(response: httpx.Response) -> str:
    """The CRM's ``error: message`` from an error response, or its status."""
    try:
        body = response.json()
        return f"{body['error']}: {body['message']}"
    except (ValueError, KeyError, TypeError):
        return f"the CRM answered {response.status_code}"
