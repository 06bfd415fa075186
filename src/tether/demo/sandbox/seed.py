"""The sandbox's seed data: what a new or reset database holds.

Fixed by reference §8 where named there (Henderson 4471 at ``silver`` without a hold, SKU-4411,
the four tiers, dana and miguel); the rest is plausible filler for the demo.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert

from tether.demo.sandbox.schema import accounts, discount_tiers, skus, users

SEED_TIERS: tuple[dict[str, Any], ...] = (
    {"tier": "standard", "pct": 0},
    {"tier": "silver", "pct": 5},
    {"tier": "gold", "pct": 10},
    {"tier": "platinum", "pct": 15},
)

SEED_ACCOUNTS: tuple[dict[str, Any], ...] = (
    {"id": "4471", "name": "Henderson", "discount_tier": "silver", "credit_hold": False},
    {"id": "4472", "name": "Alvarez Supply", "discount_tier": "standard", "credit_hold": False},
    {"id": "4473", "name": "Copperline Fabrication", "discount_tier": "gold", "credit_hold": True},
    {"id": "5100", "name": "Brightwater", "discount_tier": "platinum", "credit_hold": False},
)

SEED_SKUS: tuple[dict[str, Any], ...] = (
    {"sku": "SKU-4411", "description": "Industrial hinge kit", "list_price_cents": 1250},
    {"sku": "SKU-4412", "description": "Heavy-duty drawer slide pair", "list_price_cents": 1875},
    {"sku": "SKU-5020", "description": "Stainless cabinet latch", "list_price_cents": 420},
    {"sku": "SKU-7300", "description": "Wall mounting bracket set", "list_price_cents": 3600},
)

# Managers first: users.manager references users.id.
SEED_USERS: tuple[dict[str, Any], ...] = (
    {
        "id": "miguel",
        "role": "sales_manager",
        "accounts": ["4471", "4472", "4473"],
        "can_draft_quotes": True,
        "can_send_quotes": True,
        "max_discount_pct": 15,
        "manager": None,
    },
    {
        "id": "dana",
        "role": "inside_sales",
        "accounts": ["4471", "4472"],
        "can_draft_quotes": True,
        "can_send_quotes": True,
        "max_discount_pct": 10,
        "manager": "miguel",
    },
)

_SEED = (
    (discount_tiers, SEED_TIERS),
    (accounts, SEED_ACCOUNTS),
    (skus, SEED_SKUS),
    (users, SEED_USERS),
)


def insert_seed(conn: Connection) -> None:
    """Insert the seed rows into empty tables (called inside a write transaction)."""
    for table, rows in _SEED:
        conn.execute(insert(table), [dict(row) for row in rows])
