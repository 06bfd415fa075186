"""The sandbox's business endpoints: accounts, pricing, quotes and permissions.

The acting user is the ``X-Sandbox-User`` header (a local stand-in has no real auth).
Writes require an ``Idempotency-Key`` header and are answered from the store's
idempotency record when the key repeats.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from tether.demo.sandbox.db import SandboxStore
from tether.demo.sandbox.errors import SandboxError
from tether.demo.sandbox.records import KeyedRequest, User, WriteResult, request_digest

USER_HEADER = "X-Sandbox-User"
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
MAX_QUANTITY = 1_000_000  # keeps totals far inside SQLite's 64-bit integers

router = APIRouter()


def get_store(request: Request) -> SandboxStore:
    """The app's store, opened by its lifespan."""
    store: SandboxStore = request.app.state.store
    return store


Store = Annotated[SandboxStore, Depends(get_store)]


def current_user(request: Request, store: Store) -> User:
    """The user named by ``X-Sandbox-User``; 401 when missing or unknown."""
    user_id = request.headers.get(USER_HEADER)
    if not user_id:
        raise SandboxError(401, "unauthenticated", f"missing {USER_HEADER} header")
    user = store.user(user_id)
    if user is None:
        raise SandboxError(401, "unauthenticated", f"unknown user {user_id!r}")
    return user


CurrentUser = Annotated[User, Depends(current_user)]


def idempotency_key(request: Request) -> str:
    """The write's ``Idempotency-Key``; 400 when missing, empty or too long."""
    key = request.headers.get(IDEMPOTENCY_HEADER, "")
    if not key.strip():
        raise SandboxError(
            400, "idempotency_key_required", f"writes need an {IDEMPOTENCY_HEADER} header"
        )
    if len(key) > MAX_KEY_LENGTH:
        raise SandboxError(
            400,
            "invalid_idempotency_key",
            f"{IDEMPOTENCY_HEADER} is longer than {MAX_KEY_LENGTH} characters",
        )
    return key


IdempotencyKey = Annotated[str, Depends(idempotency_key)]

Reference = Annotated[str, Query(min_length=1, max_length=64)]


class CreateQuoteBody(BaseModel):
    """``POST /quotes``: one line, ``quantity`` of ``sku``, for ``account_id``."""

    model_config = ConfigDict(extra="forbid")

    account_id: StrictStr = Field(min_length=1, max_length=64)
    sku: StrictStr = Field(min_length=1, max_length=64)
    quantity: int = Field(strict=True, gt=0, le=MAX_QUANTITY)


class SendQuoteBody(BaseModel):
    """``POST /quotes/{quote_id}/send`` takes no parameters; ``{}`` or no body."""

    model_config = ConfigDict(extra="forbid")


def _keyed(request: Request, key: str, user: User, body: BaseModel) -> KeyedRequest:
    return KeyedRequest(
        key=key,
        method_path=f"{request.method} {request.url.path}",
        body_hash=request_digest(body.model_dump(mode="json")),
        user_id=user.id,
    )


def _written(result: WriteResult) -> JSONResponse:
    headers = {REPLAYED_HEADER: "true"} if result.replayed else None
    return JSONResponse(result.body, status_code=result.status, headers=headers)


@router.get("/healthz")
def healthz() -> dict[str, bool]:
    """The process is up."""
    return {"ok": True}


@router.get("/accounts")
def search_accounts(
    user: CurrentUser, store: Store, query: Annotated[str, Query(max_length=200)] = ""
) -> dict[str, Any]:
    """The user's accounts whose name contains ``query`` (any case) or whose id is it."""
    return {"items": store.search_accounts(user, query)}


@router.get("/accounts/{account_id}")
def get_account(account_id: str, user: CurrentUser, store: Store) -> dict[str, Any]:
    """One of the user's accounts."""
    return store.account(user, account_id)


@router.get("/pricing")
def get_pricing(
    user: CurrentUser,
    store: Store,
    account_id: Reference,
    sku: Reference,
    quantity: Annotated[int, Query(gt=0, le=MAX_QUANTITY)],
) -> dict[str, Any]:
    """``quantity`` of ``sku`` priced at the account's current discount tier."""
    return store.price(user, account_id, sku, quantity)


@router.post("/quotes", status_code=201)
def create_quote(
    body: CreateQuoteBody,
    request: Request,
    user: CurrentUser,
    key: IdempotencyKey,
    store: Store,
) -> JSONResponse:
    """Draft a quote (201); a repeated key returns the first response."""
    keyed = _keyed(request, key, user, body)
    return _written(
        store.create_quote(keyed, account_id=body.account_id, sku=body.sku, quantity=body.quantity)
    )


# Declared before /quotes/{quote_id}/... so "by-key" is never taken for a quote id.
@router.get("/quotes/by-key/{key:path}")
def quote_by_key(key: str, user: CurrentUser, store: Store) -> dict[str, Any]:
    """The quote created or sent with idempotency key ``key``: what reconcile asks."""
    return store.by_key(key)


@router.get("/quotes/{quote_id}")
def get_quote(quote_id: str, user: CurrentUser, store: Store) -> dict[str, Any]:
    """The quote as stored."""
    return store.quote(user, quote_id)


@router.get("/quotes/{quote_id}/preview")
def preview_quote(quote_id: str, user: CurrentUser, store: Store) -> dict[str, Any]:
    """The quote re-rendered at the account's current tier: what a send now would send."""
    return store.preview(user, quote_id)


@router.post("/quotes/{quote_id}/send")
def send_quote(
    quote_id: str,
    request: Request,
    user: CurrentUser,
    key: IdempotencyKey,
    store: Store,
    body: SendQuoteBody | None = None,
) -> JSONResponse:
    """Send a draft, re-priced at the current tier (200); a repeated key returns the first."""
    keyed = _keyed(request, key, user, body or SendQuoteBody())
    return _written(store.send_quote(keyed, quote_id=quote_id))


@router.get("/users/{user_id}/permissions")
def get_permissions(user_id: str, store: Store) -> dict[str, Any]:
    """A user's permissions and team; no ``X-Sandbox-User`` needed (the scope resolver)."""
    return store.permissions(user_id)
