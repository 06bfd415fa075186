"""The sandbox's admin endpoints (no auth: a local stand-in): reset, failures, and edits.

Tests and the demo use them to change the world under a waiting run: revoke a
permission, move an account to another tier or onto credit hold, count quotes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from tether.demo.sandbox.errors import SandboxError
from tether.demo.sandbox.failures import FailureInjector, FailureKind, route_keys
from tether.demo.sandbox.routes import Store

router = APIRouter(prefix="/admin")


def _injector(request: Request) -> FailureInjector:
    injector: FailureInjector = request.app.state.failures
    return injector


class FailureBody(BaseModel):
    """Arm one failure for the next request matching ``route`` ("METHOD /template")."""

    model_config = ConfigDict(extra="forbid")

    route: StrictStr
    kind: FailureKind


class AccountPatch(BaseModel):
    """Fields of an account an admin may change; omitted or null means unchanged."""

    model_config = ConfigDict(extra="forbid")

    credit_hold: StrictBool | None = None
    discount_tier: StrictStr | None = None


class PermissionsPatch(BaseModel):
    """Permission fields an admin may change; omitted or null means unchanged."""

    model_config = ConfigDict(extra="forbid")

    accounts: list[StrictStr] | None = None
    can_draft_quotes: StrictBool | None = None
    can_send_quotes: StrictBool | None = None
    max_discount_pct: Annotated[int, Field(strict=True, ge=0, le=100)] | None = None


@router.post("/reset")
def reset(request: Request, store: Store) -> dict[str, bool]:
    """Back to the seed: quotes, idempotency records and armed failures are cleared."""
    _injector(request).clear()
    store.reset()
    return {"ok": True}


@router.post("/failures")
def arm_failure(body: FailureBody, request: Request) -> dict[str, Any]:
    """Arm a one-shot failure on a route the app serves (422 ``unknown_route`` otherwise)."""
    route = " ".join(body.route.split())
    if route not in route_keys(request.app.routes):
        raise SandboxError(422, "unknown_route", f"no route {body.route!r}")
    armed = _injector(request).arm(route, body.kind)
    return {"ok": True, "route": route, "kind": body.kind, "armed": armed}


@router.patch("/accounts/{account_id}")
def patch_account(account_id: str, body: AccountPatch, store: Store) -> dict[str, Any]:
    """Change an account's credit hold and/or discount tier; returns the account."""
    return store.patch_account(account_id, body.model_dump(exclude_none=True))


@router.patch("/users/{user_id}/permissions")
def patch_permissions(user_id: str, body: PermissionsPatch, store: Store) -> dict[str, Any]:
    """Change any of a user's permission fields; returns the permissions."""
    return store.patch_permissions(user_id, body.model_dump(exclude_none=True))


@router.get("/quotes")
def list_quotes(
    store: Store, account_id: Annotated[str | None, Query(max_length=64)] = None
) -> dict[str, Any]:
    """``{"drafted", "sent", "quotes"}`` for one account (or all when omitted)."""
    return store.admin_quotes(account_id)
