"""The sandbox CRM's statements, built once, and the reads shared by its transactions.

Each helper runs inside a caller's transaction (``conn``), so a check and the write that
depends on it see the same snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, insert, or_, select, update

from tether.demo.sandbox.errors import SandboxError, not_found
from tether.demo.sandbox.records import User, unit_price_cents
from tether.demo.sandbox.schema import (
    QuoteStatus,
    accounts,
    discount_tiers,
    idempotency_keys,
    quotes,
    skus,
    users,
)

# --- statements, built once --------------------------------------------------------------

ACCOUNT_COLUMNS = select(
    accounts.c.id,
    accounts.c.name,
    accounts.c.discount_tier,
    discount_tiers.c.pct.label("discount_pct"),
    accounts.c.credit_hold,
).join_from(accounts, discount_tiers, accounts.c.discount_tier == discount_tiers.c.tier)

SELECT_ACCOUNT = ACCOUNT_COLUMNS.where(accounts.c.id == bindparam("account_id"))

SEARCH_ACCOUNTS = ACCOUNT_COLUMNS.where(
    accounts.c.id.in_(bindparam("ids", expanding=True)),
    or_(
        accounts.c.id == bindparam("query"),
        func.instr(func.lower(accounts.c.name), bindparam("needle")) > 0,
    ),
).order_by(accounts.c.id)

COUNT_ACCOUNTS_IN = select(func.count()).where(accounts.c.id.in_(bindparam("ids", expanding=True)))

SELECT_TIER_PCT = select(discount_tiers.c.pct).where(discount_tiers.c.tier == bindparam("tier"))

SELECT_USER = select(users).where(users.c.id == bindparam("user_id"))

SELECT_TEAM = select(users.c.id).where(users.c.manager == bindparam("user_id")).order_by(users.c.id)

SELECT_SKU_PRICES = select(skus.c.sku, skus.c.list_price_cents).where(
    skus.c.sku.in_(bindparam("skus", expanding=True))
)

QUOTE_COLUMNS = select(quotes, accounts.c.name.label("account_name")).join_from(
    quotes, accounts, quotes.c.account_id == accounts.c.id
)

SELECT_QUOTE = QUOTE_COLUMNS.where(quotes.c.quote_id == bindparam("quote_id"))

SELECT_ALL_QUOTES = QUOTE_COLUMNS.order_by(quotes.c.seq)

SELECT_ACCOUNT_QUOTES = QUOTE_COLUMNS.where(
    quotes.c.account_id == bindparam("account_id")
).order_by(quotes.c.seq)

NEXT_QUOTE_SEQ = select(func.coalesce(func.max(quotes.c.seq), 1000) + 1)

INSERT_QUOTE = insert(quotes)

# A transition is one conditional UPDATE; rowcount says whether it applied.
SEND_QUOTE = (
    update(quotes)
    .where(quotes.c.quote_id == bindparam("b_quote_id"), quotes.c.status == QuoteStatus.DRAFT)
    .values(
        lines=bindparam("lines"),
        discount_tier=bindparam("discount_tier"),
        discount_pct=bindparam("discount_pct"),
        total_cents=bindparam("total_cents"),
        status=QuoteStatus.SENT,
        sent_by=bindparam("sent_by"),
        sent_key=bindparam("sent_key"),
        sent_at=bindparam("sent_at"),
    )
)

SELECT_KEY = select(idempotency_keys).where(idempotency_keys.c.key == bindparam("key"))

INSERT_KEY = insert(idempotency_keys)


# --- reads inside a transaction ---------------------------------------------------------


def load_user(conn: Connection, user_id: str) -> User | None:
    """The user with that id, or None."""
    row = conn.execute(SELECT_USER, {"user_id": user_id}).first()
    return None if row is None else User.from_row(row)


def load_quote(conn: Connection, quote_id: str) -> Row[Any]:
    """The quote with its account's name; 404 when there is none."""
    row = conn.execute(SELECT_QUOTE, {"quote_id": quote_id}).first()
    if row is None:
        raise not_found(f"quote {quote_id}")
    return row


def visible_account(conn: Connection, user: User, account_id: str) -> Row[Any]:
    """The account if the user may see it; otherwise 404, unknown or not theirs alike."""
    row = None
    if account_id in user.accounts:
        row = conn.execute(SELECT_ACCOUNT, {"account_id": account_id}).first()
    if row is None:
        raise not_found(f"account {account_id}")
    return row


def list_prices(conn: Connection, wanted: Sequence[str]) -> dict[str, int]:
    """List prices in cents of the ``wanted`` SKUs; 422 naming any unknown one."""
    prices = dict(conn.execute(SELECT_SKU_PRICES, {"skus": sorted(set(wanted))}).tuples().all())
    missing = sorted(set(wanted) - prices.keys())
    if missing:
        raise SandboxError(422, "unknown_sku", f"unknown SKU: {', '.join(missing)}")
    return prices


def price_lines(
    conn: Connection, lines: Sequence[Mapping[str, Any]], discount_pct: int
) -> list[dict[str, Any]]:
    """The lines re-priced from current list prices at ``discount_pct`` (cents)."""
    prices = list_prices(conn, [line["sku"] for line in lines])
    return [
        {
            "sku": line["sku"],
            "quantity": line["quantity"],
            "unit_price_cents": unit_price_cents(prices[line["sku"]], discount_pct),
        }
        for line in lines
    ]


def total_cents(lines: Sequence[Mapping[str, Any]]) -> int:
    """The sum of the lines in cents."""
    return sum(int(line["quantity"]) * int(line["unit_price_cents"]) for line in lines)
