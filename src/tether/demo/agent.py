"""The demo agent: a sales assistant whose tools call the sandbox CRM over HTTP.

It is also the example of putting your own agent on tether: tools are typed functions
that get their dependencies from ``ctx.deps`` (here a ``Crm``); the write that a human must
confirm has a ``preview`` (what the human approves), a ``guard`` (business checks re-run at
approval time), a ``permitted`` check on the user's scope, and a ``reconcile`` that finds
a write's outcome by its idempotency key. ``build_agent`` is the CLI's default ``--agent``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from tether import (
    Agent,
    GuardResult,
    Reconciled,
    Scope,
    ScriptedModel,
    Settings,
    Tool,
    ToolContext,
    ToolFailed,
    tool,
)
from tether.demo.crm import Crm, crm_of
from tether.demo.lifespan import sandbox_db_for, sandbox_lifespan
from tether.scope import ScopeResolver

# The send's preview, exactly these fields (reference §8).
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

# The demo users of reference §8 (ids as in the sandbox) and their fixed API keys, which the
# README lists; ``migrate`` and ``serve`` make sure they exist.
DEMO_USERS = {"dana": "tether-demo-dana", "miguel": "tether-demo-miguel"}

SYSTEM_PROMPT = """\
You are a sales assistant for an inside-sales team. You help a rep find accounts, price \
SKUs and draft and send quotes in the CRM through your tools. Use only the tools' results \
for names, prices and discounts; never invent them. Sending a quote is confirmed by a \
person: if a send is declined or refused, say so plainly and do not retry it on your own."""

ORDER = {"account_id": "4471", "sku": "SKU-4411", "quantity": 200}

# The demo's scripted model: one turn per assistant message already in the history.
DEMO_TURNS: tuple[dict[str, Any], ...] = (
    {
        "content": "Let me find Henderson in the CRM first.",
        "tool_calls": [{"name": "find_account", "arguments": {"query": "Henderson"}}],
    },
    {"tool_calls": [{"name": "get_pricing", "arguments": ORDER}]},
    {"tool_calls": [{"name": "draft_quote", "arguments": ORDER}]},
    {
        "content": "The quote is drafted at Henderson's tier; sending it to the customer "
        "needs your confirmation, so I am asking you now.",
        "tool_calls": [
            {"name": "send_quote", "arguments": {"quote_id": "${draft_quote.quote_id}"}}
        ],
    },
    {
        "content": "I drafted the quote for Henderson (200 x SKU-4411) and put the send to "
        "you for confirmation; the tool results above say how it went."
    },
)


def _quote_result(quote: dict[str, Any]) -> dict[str, Any]:
    return {name: quote.get(name) for name in QUOTE_FIELDS}


async def _reconcile(key: str, ctx: ToolContext, action: str) -> Reconciled:
    """The write made with ``key``, by asking the CRM's idempotency record."""
    if not isinstance(ctx.deps, Crm):
        return Reconciled.unknown("no CRM to ask (the agent has no Crm deps)")
    record = await ctx.deps.write_by_key(key, ctx.user_id)
    if isinstance(record, Reconciled):
        return record
    if record.get("action") != action:
        return Reconciled.unknown(f"key {key} was used for {record.get('action')!r}")
    # The first response to that key: what the tool returned, or would have returned.
    return Reconciled.found(_quote_result(record["response"]["body"]))


async def reconcile_draft(key: str, ctx: ToolContext) -> Reconciled:
    """Whether the draft made with ``key`` exists, and what it returned."""
    return await _reconcile(key, ctx, "created")


async def reconcile_send(key: str, ctx: ToolContext) -> Reconciled:
    """Whether the send made with ``key`` happened, and what it returned."""
    return await _reconcile(key, ctx, "sent")


# -- the tools -----------------------------------------------------------------------------


@tool
async def find_account(ctx: ToolContext, query: str) -> dict[str, Any]:
    """Find your accounts whose name contains the query (or whose id is it)."""
    found = await crm_of(ctx).call("GET", "/accounts", user=ctx.user_id, params={"query": query})
    return {"accounts": found["items"]}


@tool
async def get_pricing(ctx: ToolContext, account_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Price a quantity of a SKU at the account's current discount tier."""
    params = {"account_id": account_id, "sku": sku, "quantity": quantity}
    return await crm_of(ctx).call("GET", "/pricing", user=ctx.user_id, params=params)


@tool(effect="write", dedupes=True, reconcile=reconcile_draft)
async def draft_quote(ctx: ToolContext, account_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Draft a one-line quote for an account; returns the quote with its quote_id."""
    body = {"account_id": account_id, "sku": sku, "quantity": quantity}
    created = await crm_of(ctx).call(
        "POST", "/quotes", user=ctx.user_id, key=ctx.idempotency_key, body=body
    )
    return _quote_result(created)


async def send_preview(crm: Crm, args: BaseModel, scope: Scope) -> dict[str, Any]:
    """The quote as a send now would send it, re-priced at the account's current tier."""
    path = f"/quotes/{quote(_quote_id(args), safe='')}/preview"
    rendered = await crm.call("GET", path, user=scope.user_id)
    return {name: rendered[name] for name in PREVIEW_FIELDS}


async def send_guard(args: BaseModel, scope: Scope, ctx: ToolContext) -> GuardResult:
    """Refuse a send to an account on credit hold, or above the user's discount limit."""
    try:
        crm = crm_of(ctx)
        preview = await send_preview(crm, args, scope)
        account = await crm.call("GET", f"/accounts/{preview['account_id']}", user=scope.user_id)
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


async def may_send(crm: Crm, args: BaseModel, scope: Scope) -> bool:
    """Whether the user may send quotes, for this quote's account."""
    if not scope.permissions.get("can_send_quotes"):
        return False
    try:
        path = f"/quotes/{quote(_quote_id(args), safe='')}"
        stored = await crm.call("GET", path, user=scope.user_id)
    except ToolFailed as exc:
        if exc.details.get("status") == 404:  # unknown, or on an account not the user's
            return False
        raise
    return stored["account_id"] in scope.permissions.get("accounts", ())


def _quote_id(args: BaseModel) -> str:
    return str(args.model_dump()["quote_id"])


async def _send_quote(ctx: ToolContext, quote_id: str) -> dict[str, Any]:
    """Send a drafted quote to the customer. A person confirms every send."""
    path = f"/quotes/{quote(quote_id, safe='')}/send"
    sent = await crm_of(ctx).call("POST", path, user=ctx.user_id, key=ctx.idempotency_key, body={})
    return _quote_result(sent)


def send_quote_tool(crm: Crm) -> Tool:
    """``send_quote``, the write that needs confirmation. Its preview and permission check
    are given only the arguments and the scope, so they are bound to ``crm`` here; the
    call itself and its guard read the CRM from ``ctx.deps`` like every other tool."""
    declare = tool(
        name="send_quote",
        effect="write",
        needs_confirmation=True,
        dedupes=True,
        preview=partial(send_preview, crm),
        guard=send_guard,
        permitted=partial(may_send, crm),
        reconcile=reconcile_send,
    )
    return declare(_send_quote)


# -- scope, model, agent -------------------------------------------------------------------


def scope_resolver(crm: Crm) -> ScopeResolver:
    """The resolver of users' scopes in ``crm``."""

    async def resolve_scope(user_id: str) -> Scope:
        """The user's permissions in the CRM now; their manager may approve their sends.
        A user the CRM does not know gets an empty scope (no accounts, no rights)."""
        found = await crm.permissions(user_id)
        if found is None:
            return Scope(user_id=user_id)
        manager = found.get("manager")
        return Scope(
            user_id=user_id,
            permissions={name: found[name] for name in PERMISSION_FIELDS},
            approvers=frozenset({manager}) if manager else frozenset(),
        )

    return resolve_scope


# The demo model writes its text a few letters at a time, as a provider's model streams it
# (reference §16): the first scene shows it in the terminal as it is written.
DEMO_PACE = {"chunk_chars": 3, "delay_s": 0.012}


def demo_model() -> ScriptedModel:
    """The scripted model of the demo story."""
    return ScriptedModel(DEMO_TURNS, stream=DEMO_PACE)


def with_crm(agent: Agent, crm: Crm) -> Agent:
    """``agent`` pointed at ``crm``: its tools' deps, its scope resolver and the send."""
    tools = (find_account, get_pricing, draft_quote, send_quote_tool(crm))
    return replace(agent, deps=crm, tools=tools, resolve_scope=scope_resolver(crm))


def build_agent(settings: Settings | None = None, *, sandbox_db: str | Path | None = None) -> Agent:
    """The demo sales agent (the CLI's default ``--agent``), calling the sandbox at
    ``settings.sandbox_url``. Without one, serving it starts the sandbox in-process on
    ``sandbox_db`` (default: ``sandbox.db`` next to a SQLite tether database, else in the
    working folder)."""
    settings = settings or Settings.from_env()
    db = Path(sandbox_db) if sandbox_db is not None else sandbox_db_for(settings.database_url)
    agent = Agent(
        name="sales-demo",
        system_prompt=SYSTEM_PROMPT,
        default_model=demo_model,
        users=DEMO_USERS,
        users_max_priority=10,  # so the walkthroughs may show priorities
        lifespan=sandbox_lifespan(db, with_crm),
    )
    return with_crm(agent, Crm(base_url=settings.sandbox_url))
