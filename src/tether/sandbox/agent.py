"""The demo agent: a sales assistant whose tools call the sandbox CRM over HTTP.

It is also the example of putting your own agent on tether: tools are typed functions;
the write that a human must confirm has a ``preview`` (what the human approves), a
``guard`` (business checks re-run at approval time), a ``permitted`` check on the user's
scope, and a ``reconcile`` that finds a write's outcome by its idempotency key.

Errors are mapped for crash safety (SPEC invariant 3): a 4xx means the CRM refused and
nothing happened (``ToolFailed``); a timeout, a dropped connection or a 5xx on a write may
have committed (``OutcomeUnknown``), so tether reconciles it by key before going on.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from tether import (
    Agent,
    GuardResult,
    OutcomeUnknown,
    Reconciled,
    Scope,
    ScriptedModel,
    ToolContext,
    ToolFailed,
    tool,
)
from tether.errors import TetherError

DEFAULT_SANDBOX_URL = "http://127.0.0.1:8100"
TIMEOUT_S = 10.0
USER_HEADER = "X-Sandbox-User"
IDEMPOTENCY_HEADER = "Idempotency-Key"

# The send's preview, exactly these fields (SPEC §8).
PREVIEW_FIELDS = (
    "quote_id",
    "account_id",
    "account_name",
    "lines",
    "discount_tier",
    "discount_pct",
    "total",
)
# What the model sees of a quote (the draft's and the send's result).
QUOTE_FIELDS = (*PREVIEW_FIELDS, "status")
PERMISSION_FIELDS = ("accounts", "can_draft_quotes", "can_send_quotes", "max_discount_pct")

SYSTEM_PROMPT = """\
You are a sales assistant for an inside-sales team. You help a rep find accounts, price \
SKUs and draft and send quotes in the CRM through your tools. Use only the tools' results \
for names, prices and discounts; never invent them. Sending a quote is confirmed by a \
person: if a send is declined or refused, say so plainly and do not retry it on your own."""

ORDER = {"account_id": "4471", "sku": "SKU-4411", "quantity": 200}

# The demo's scripted model: one turn per assistant message already in the history.
DEMO_TURNS: tuple[dict[str, Any], ...] = (
    {"tool_calls": [{"name": "find_account", "arguments": {"query": "Henderson"}}]},
    {"tool_calls": [{"name": "get_pricing", "arguments": ORDER}]},
    {"tool_calls": [{"name": "draft_quote", "arguments": ORDER}]},
    {"tool_calls": [{"name": "send_quote", "arguments": {"quote_id": "${draft_quote.quote_id}"}}]},
    {
        "content": "I drafted the quote for Henderson (200 x SKU-4411) and put the send to "
        "you for confirmation; the tool results above say how it went."
    },
)


class SandboxUnavailable(TetherError):
    """The sandbox CRM could not be reached to resolve a user's scope."""

    code = "sandbox_unavailable"
    http_status = 503


def sandbox_url() -> str:
    """The CRM's base URL, read on every call so a process can point it anywhere."""
    return (os.environ.get("TETHER_SANDBOX_URL") or DEFAULT_SANDBOX_URL).rstrip("/")


# -- HTTP, with the error mapping ------------------------------------------------------------


async def _call(
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
    headers = {USER_HEADER: user}
    if key is not None:
        headers[IDEMPOTENCY_HEADER] = key
    what = f"{method} {path}"
    try:
        async with httpx.AsyncClient(base_url=sandbox_url(), timeout=TIMEOUT_S) as client:
            response = await client.request(method, path, headers=headers, params=params, json=body)
    except httpx.HTTPError as exc:
        if key is not None:
            raise OutcomeUnknown(f"{what}: no answer from the CRM ({exc!r})") from exc
        raise ToolFailed(f"{what}: the CRM could not be reached ({exc!r})") from exc
    if response.status_code >= 500 and key is not None:
        raise OutcomeUnknown(f"{what}: the CRM answered {response.status_code}")
    if response.is_error:
        raise ToolFailed(f"{what}: {_error_message(response)}", status=response.status_code)
    data: dict[str, Any] = response.json()
    return data


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return f"{body['error']}: {body['message']}"
    except (ValueError, KeyError, TypeError):
        return f"the CRM answered {response.status_code}"


def _quote_result(quote: dict[str, Any]) -> dict[str, Any]:
    return {name: quote.get(name) for name in QUOTE_FIELDS}


async def _reconcile(key: str, ctx: ToolContext, action: str) -> Reconciled:
    """The write made with ``key``, by asking the CRM's idempotency record."""
    try:
        async with httpx.AsyncClient(base_url=sandbox_url(), timeout=TIMEOUT_S) as client:
            response = await client.get(
                f"/quotes/by-key/{quote(key, safe='')}", headers={USER_HEADER: ctx.user_id}
            )
    except httpx.HTTPError as exc:
        return Reconciled.unknown(f"the CRM could not be reached: {exc!r}")
    if response.status_code == 404:
        return Reconciled.absent()
    if response.is_error:
        return Reconciled.unknown(f"the CRM answered {response.status_code}")
    record = response.json()
    if record.get("action") != action:
        return Reconciled.unknown(f"key {key} was used for {record.get('action')!r}")
    # The first response to that key: what the tool returned, or would have returned.
    return Reconciled.found(_quote_result(record["response"]["body"]))


async def reconcile_draft(key: str, ctx: ToolContext) -> Reconciled:
    return await _reconcile(key, ctx, "created")


async def reconcile_send(key: str, ctx: ToolContext) -> Reconciled:
    return await _reconcile(key, ctx, "sent")


# -- the tools -----------------------------------------------------------------------------


@tool
async def find_account(ctx: ToolContext, query: str) -> dict[str, Any]:
    """Find your accounts whose name contains the query (or whose id is it)."""
    found = await _call("GET", "/accounts", user=ctx.user_id, params={"query": query})
    return {"accounts": found["items"]}


@tool
async def get_pricing(ctx: ToolContext, account_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Price a quantity of a SKU at the account's current discount tier."""
    params = {"account_id": account_id, "sku": sku, "quantity": quantity}
    return await _call("GET", "/pricing", user=ctx.user_id, params=params)


# tool(...) is typed Any until tether.tools.tool gets overloads; hence the ignores.
@tool(effect="write", dedupes=True, reconcile=reconcile_draft)
async def draft_quote(ctx: ToolContext, account_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Draft a one-line quote for an account; returns the quote with its quote_id."""
    body = {"account_id": account_id, "sku": sku, "quantity": quantity}
    created = await _call("POST", "/quotes", user=ctx.user_id, key=ctx.idempotency_key, body=body)
    return _quote_result(created)


async def send_preview(args: BaseModel, scope: Scope) -> dict[str, Any]:
    """The quote as a send now would send it, re-priced at the account's current tier."""
    rendered = await _call(
        "GET", f"/quotes/{quote(_quote_id(args), safe='')}/preview", user=scope.user_id
    )
    return {name: rendered[name] for name in PREVIEW_FIELDS}


async def send_guard(args: BaseModel, scope: Scope, ctx: ToolContext) -> GuardResult:
    """Refuse a send to an account on credit hold, or above the user's discount limit."""
    try:
        preview = await send_preview(args, scope)
        account = await _call("GET", f"/accounts/{preview['account_id']}", user=scope.user_id)
    except ToolFailed as exc:
        return GuardResult.refuse(f"cannot check the account: {exc.message}")
    if account["credit_hold"]:
        return GuardResult.refuse(f"{account['name']} ({account['id']}) is on credit hold")
    limit = scope.permissions.get("max_discount_pct", 0)
    if preview["discount_pct"] > limit:
        return GuardResult.refuse(
            f"a {preview['discount_pct']}% discount is above your limit of {limit}%"
        )
    return GuardResult.allow()


async def may_send(args: BaseModel, scope: Scope) -> bool:
    """Whether the user may send quotes, for this quote's account."""
    if not scope.permissions.get("can_send_quotes"):
        return False
    try:
        stored = await _call(
            "GET", f"/quotes/{quote(_quote_id(args), safe='')}", user=scope.user_id
        )
    except ToolFailed as exc:
        if exc.details.get("status") == 404:  # unknown, or on an account not the user's
            return False
        raise
    return stored["account_id"] in scope.permissions.get("accounts", ())


def _quote_id(args: BaseModel) -> str:
    return str(args.model_dump()["quote_id"])


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    preview=send_preview,
    guard=send_guard,
    permitted=may_send,
    reconcile=reconcile_send,
)
async def send_quote(ctx: ToolContext, quote_id: str) -> dict[str, Any]:
    """Send a drafted quote to the customer. A person confirms every send."""
    path = f"/quotes/{quote(quote_id, safe='')}/send"
    sent = await _call("POST", path, user=ctx.user_id, key=ctx.idempotency_key, body={})
    return _quote_result(sent)


# -- scope, model, agent -------------------------------------------------------------------


async def resolve_scope(user_id: str) -> Scope:
    """The user's permissions in the CRM now; their manager may approve their sends.
    A user the CRM does not know gets an empty scope (no accounts, no rights)."""
    path = f"/users/{quote(user_id, safe='')}/permissions"
    try:
        async with httpx.AsyncClient(base_url=sandbox_url(), timeout=TIMEOUT_S) as client:
            response = await client.get(path)
    except httpx.HTTPError as exc:
        raise SandboxUnavailable(f"cannot reach the CRM at {sandbox_url()}: {exc!r}") from exc
    if response.status_code == 404:
        return Scope(user_id=user_id)
    if response.is_error:
        raise SandboxUnavailable(f"GET {path}: {_error_message(response)}")
    found = response.json()
    manager = found.get("manager")
    return Scope(
        user_id=user_id,
        permissions={name: found[name] for name in PERMISSION_FIELDS},
        approvers=frozenset({manager}) if manager else frozenset(),
    )


def demo_model() -> ScriptedModel:
    """The scripted model of the demo story."""
    return ScriptedModel(DEMO_TURNS)


def build_agent() -> Agent:
    """The demo sales agent (the CLI's default ``--agent``)."""
    return Agent(
        name="sales-demo",
        system_prompt=SYSTEM_PROMPT,
        tools=(find_account, get_pricing, draft_quote, send_quote),
        resolve_scope=resolve_scope,
        default_model=demo_model,
    )
