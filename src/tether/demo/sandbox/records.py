"""The sandbox CRM's records and the JSON shapes it answers with.

Money is kept in integer cents and rendered as 2-decimal JSON numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import Row

# --- money ------------------------------------------------------------------------------


def unit_price_cents(list_price_cents: int, discount_pct: int) -> int:
    """The discounted unit price in cents, rounded half-up to the cent."""
    exact = Decimal(list_price_cents) * (100 - discount_pct) / 100
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def amount(cents: int) -> float:
    """Cents as a JSON number of currency units (``1188`` → ``11.88``)."""
    return cents / 100


def request_digest(body: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a validated request body (key order ignored)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def now() -> str:
    """The current time as an ISO-8601 string (UTC), as the CRM stores it."""
    return datetime.now(UTC).isoformat()


# --- records ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class User:
    """A sandbox user and their permissions."""

    id: str
    role: str
    accounts: tuple[str, ...]
    can_draft_quotes: bool
    can_send_quotes: bool
    max_discount_pct: int
    manager: str | None

    @classmethod
    def from_row(cls, row: Row[Any]) -> User:
        return cls(
            id=row.id,
            role=row.role,
            accounts=tuple(row.accounts),
            can_draft_quotes=bool(row.can_draft_quotes),
            can_send_quotes=bool(row.can_send_quotes),
            max_discount_pct=row.max_discount_pct,
            manager=row.manager,
        )


@dataclass(frozen=True, kw_only=True)
class KeyedRequest:
    """What identifies an idempotent write: a repeat must match all but the user."""

    key: str
    method_path: str
    body_hash: str
    user_id: str


@dataclass(frozen=True, kw_only=True)
class WriteResult:
    """A write's response; ``replayed`` when it is the stored answer to an earlier request."""

    status: int
    body: dict[str, Any]
    replayed: bool


# --- JSON shapes ------------------------------------------------------------------------


def account_json(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "discount_tier": row.discount_tier,
        "discount_pct": row.discount_pct,
        "credit_hold": bool(row.credit_hold),
    }


def lines_json(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "sku": line["sku"],
            "quantity": line["quantity"],
            "unit_price": amount(line["unit_price_cents"]),
        }
        for line in lines
    ]


def quote_json(row: Row[Any]) -> dict[str, Any]:
    return {
        "quote_id": row.quote_id,
        "account_id": row.account_id,
        "account_name": row.account_name,
        "lines": lines_json(row.lines),
        "discount_tier": row.discount_tier,
        "discount_pct": row.discount_pct,
        "total": amount(row.total_cents),
        "status": row.status,
        "created_by": row.created_by,
        "created_key": row.created_key,
        "created_at": row.created_at,
        "sent_by": row.sent_by,
        "sent_key": row.sent_key,
        "sent_at": row.sent_at,
    }


def permissions_json(user: User, team: Sequence[str]) -> dict[str, Any]:
    return {
        "user_id": user.id,
        "role": user.role,
        "accounts": list(user.accounts),
        "can_draft_quotes": user.can_draft_quotes,
        "can_send_quotes": user.can_send_quotes,
        "max_discount_pct": user.max_discount_pct,
        "manager": user.manager,
        "team": list(team),
    }
