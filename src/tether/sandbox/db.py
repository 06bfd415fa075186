"""Every query and write of the sandbox CRM, and the JSON shapes it answers with.

Writes run in ``BEGIN IMMEDIATE`` transactions, so two requests carrying the same
idempotency key are serialised and only the first writes; the key's record is inserted in
the same transaction as the write it describes, so a crash after the commit never loses
the record of what was written. Money is kept in integer cents and rendered as 2-decimal
JSON numbers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, func, insert, or_, select, update

from tether.sandbox.errors import SandboxError, forbidden, not_found
from tether.sandbox.schema import (
    Action,
    QuoteStatus,
    accounts,
    discount_tiers,
    idempotency_keys,
    metadata,
    open_engine,
    quotes,
    skus,
    users,
    writer,
)
from tether.sandbox.seed import insert_seed

log = logging.getLogger(__name__)

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


def _now() -> str:
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


# --- statements, built once --------------------------------------------------------------

_ACCOUNT_COLUMNS = select(
    accounts.c.id,
    accounts.c.name,
    accounts.c.discount_tier,
    discount_tiers.c.pct.label("discount_pct"),
    accounts.c.credit_hold,
).join_from(accounts, discount_tiers, accounts.c.discount_tier == discount_tiers.c.tier)

_SELECT_ACCOUNT = _ACCOUNT_COLUMNS.where(accounts.c.id == bindparam("account_id"))

_SEARCH_ACCOUNTS = _ACCOUNT_COLUMNS.where(
    accounts.c.id.in_(bindparam("ids", expanding=True)),
    or_(
        accounts.c.id == bindparam("query"),
        func.instr(func.lower(accounts.c.name), bindparam("needle")) > 0,
    ),
).order_by(accounts.c.id)

_COUNT_ACCOUNTS_IN = select(func.count()).where(accounts.c.id.in_(bindparam("ids", expanding=True)))

_SELECT_TIER_PCT = select(discount_tiers.c.pct).where(discount_tiers.c.tier == bindparam("tier"))

_SELECT_USER = select(users).where(users.c.id == bindparam("user_id"))

_SELECT_TEAM = (
    select(users.c.id).where(users.c.manager == bindparam("user_id")).order_by(users.c.id)
)

_SELECT_SKU_PRICES = select(skus.c.sku, skus.c.list_price_cents).where(
    skus.c.sku.in_(bindparam("skus", expanding=True))
)

_QUOTE_COLUMNS = select(quotes, accounts.c.name.label("account_name")).join_from(
    quotes, accounts, quotes.c.account_id == accounts.c.id
)

_SELECT_QUOTE = _QUOTE_COLUMNS.where(quotes.c.quote_id == bindparam("quote_id"))

_SELECT_ALL_QUOTES = _QUOTE_COLUMNS.order_by(quotes.c.seq)

_SELECT_ACCOUNT_QUOTES = _QUOTE_COLUMNS.where(
    quotes.c.account_id == bindparam("account_id")
).order_by(quotes.c.seq)

_NEXT_QUOTE_SEQ = select(func.coalesce(func.max(quotes.c.seq), 1000) + 1)

_INSERT_QUOTE = insert(quotes)

# A transition is one conditional UPDATE; rowcount says whether it applied.
_SEND_QUOTE = (
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

_SELECT_KEY = select(idempotency_keys).where(idempotency_keys.c.key == bindparam("key"))

_INSERT_KEY = insert(idempotency_keys)


# --- JSON shapes ------------------------------------------------------------------------


def _account_json(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "discount_tier": row.discount_tier,
        "discount_pct": row.discount_pct,
        "credit_hold": bool(row.credit_hold),
    }


def _lines_json(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "sku": line["sku"],
            "quantity": line["quantity"],
            "unit_price": amount(line["unit_price_cents"]),
        }
        for line in lines
    ]


def _quote_json(row: Row[Any]) -> dict[str, Any]:
    return {
        "quote_id": row.quote_id,
        "account_id": row.account_id,
        "account_name": row.account_name,
        "lines": _lines_json(row.lines),
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


def _permissions_json(user: User, team: Sequence[str]) -> dict[str, Any]:
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


# --- helpers used inside a transaction --------------------------------------------------


def _load_user(conn: Connection, user_id: str) -> User | None:
    row = conn.execute(_SELECT_USER, {"user_id": user_id}).first()
    return None if row is None else User.from_row(row)


def _load_quote(conn: Connection, quote_id: str) -> Row[Any]:
    row = conn.execute(_SELECT_QUOTE, {"quote_id": quote_id}).first()
    if row is None:
        raise not_found(f"quote {quote_id}")
    return row


def _visible_account(conn: Connection, user: User, account_id: str) -> Row[Any]:
    """The account if the user may see it; otherwise 404, unknown or not theirs alike."""
    row = None
    if account_id in user.accounts:
        row = conn.execute(_SELECT_ACCOUNT, {"account_id": account_id}).first()
    if row is None:
        raise not_found(f"account {account_id}")
    return row


def _list_prices(conn: Connection, wanted: Sequence[str]) -> dict[str, int]:
    """List prices in cents of the ``wanted`` SKUs; 422 naming any unknown one."""
    prices = dict(conn.execute(_SELECT_SKU_PRICES, {"skus": sorted(set(wanted))}).tuples().all())
    missing = sorted(set(wanted) - prices.keys())
    if missing:
        raise SandboxError(422, "unknown_sku", f"unknown SKU: {', '.join(missing)}")
    return prices


def _price_lines(
    conn: Connection, lines: Sequence[Mapping[str, Any]], discount_pct: int
) -> list[dict[str, Any]]:
    """The lines re-priced from current list prices at ``discount_pct`` (cents)."""
    prices = _list_prices(conn, [line["sku"] for line in lines])
    return [
        {
            "sku": line["sku"],
            "quantity": line["quantity"],
            "unit_price_cents": unit_price_cents(prices[line["sku"]], discount_pct),
        }
        for line in lines
    ]


def _total_cents(lines: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(line["quantity"]) * int(line["unit_price_cents"]) for line in lines)


# --- the store --------------------------------------------------------------------------

_Write = Callable[[Connection, User], tuple[int, str, dict[str, Any]]]


class SandboxStore:
    """Every read and write of the sandbox CRM, over one SQLite engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = writer(engine)

    @classmethod
    def open(cls, db_path: str) -> SandboxStore:
        """Open (creating and seeding if new) the sandbox database at ``db_path``."""
        store = cls(open_engine(db_path))
        store.initialize()
        return store

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def initialize(self) -> None:
        """Create missing tables and seed an empty database.

        Safe to run on every start: the emptiness check and the seed share one write
        transaction, so a database is seeded once and existing data is left alone.
        """
        metadata.create_all(self._engine)
        with self._writer.begin() as conn:
            if conn.execute(select(func.count()).select_from(accounts)).scalar_one() == 0:
                insert_seed(conn)
                log.info("sandbox database seeded", extra={"action": "seed"})

    def reset(self) -> None:
        """Put the database back to the seed: quotes and idempotency records are deleted."""
        with self._writer.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())
            insert_seed(conn)
        log.info("sandbox database reset", extra={"action": "reset"})

    # --- reads ----------------------------------------------------------------------

    def user(self, user_id: str) -> User | None:
        """The user with that id, or None."""
        with self._engine.connect() as conn:
            return _load_user(conn, user_id)

    def permissions(self, user_id: str) -> dict[str, Any]:
        """The user's permissions, team included (404 for an unknown user)."""
        with self._engine.connect() as conn:
            return self._permissions(conn, user_id)

    def search_accounts(self, user: User, query: str) -> list[dict[str, Any]]:
        """The user's accounts whose name contains ``query`` (any case) or whose id is it."""
        text = query.strip()
        with self._engine.connect() as conn:
            rows = conn.execute(
                _SEARCH_ACCOUNTS,
                {"ids": list(user.accounts), "query": text, "needle": text.lower()},
            ).all()
        return [_account_json(row) for row in rows]

    def account(self, user: User, account_id: str) -> dict[str, Any]:
        """One of the user's accounts (404 otherwise)."""
        with self._engine.connect() as conn:
            return _account_json(_visible_account(conn, user, account_id))

    def price(self, user: User, account_id: str, sku: str, quantity: int) -> dict[str, Any]:
        """``quantity`` of ``sku`` priced at the account's current discount tier."""
        with self._engine.connect() as conn:
            account = _visible_account(conn, user, account_id)
            list_cents = _list_prices(conn, [sku])[sku]
        unit_cents = unit_price_cents(list_cents, account.discount_pct)
        return {
            "account_id": account.id,
            "sku": sku,
            "quantity": quantity,
            "list_price": amount(list_cents),
            "discount_tier": account.discount_tier,
            "discount_pct": account.discount_pct,
            "unit_price": amount(unit_cents),
            "total": amount(quantity * unit_cents),
        }

    def quote(self, user: User, quote_id: str) -> dict[str, Any]:
        """The quote as stored, if its account is one of the user's (404 otherwise)."""
        with self._engine.connect() as conn:
            row = _load_quote(conn, quote_id)
            if row.account_id not in user.accounts:
                raise not_found(f"quote {quote_id}")
            return _quote_json(row)

    def preview(self, user: User, quote_id: str) -> dict[str, Any]:
        """The quote re-rendered at the account's current tier: what a send now would send."""
        with self._engine.connect() as conn:
            row = _load_quote(conn, quote_id)
            if row.account_id not in user.accounts:
                raise not_found(f"quote {quote_id}")
            account = _visible_account(conn, user, row.account_id)
            lines = _price_lines(conn, row.lines, account.discount_pct)
        return {
            "quote_id": row.quote_id,
            "account_id": row.account_id,
            "account_name": account.name,
            "lines": _lines_json(lines),
            "discount_tier": account.discount_tier,
            "discount_pct": account.discount_pct,
            "total": amount(_total_cents(lines)),
        }

    def by_key(self, key: str) -> dict[str, Any]:
        """The quote created or sent with idempotency key ``key`` (what reconcile asks)."""
        with self._engine.connect() as conn:
            record = conn.execute(_SELECT_KEY, {"key": key}).first()
            if record is None:
                raise not_found(f"write with idempotency key {key!r}")
            quote = _load_quote(conn, record.quote_id)
        return {
            "action": record.action,
            "quote": _quote_json(quote),
            "response": {"status": record.status_code, "body": record.response},
        }

    def admin_quotes(self, account_id: str | None) -> dict[str, Any]:
        """Quote counts and quotes, for one account or all."""
        with self._engine.connect() as conn:
            if account_id is None:
                rows = conn.execute(_SELECT_ALL_QUOTES).all()
            else:
                if conn.execute(_SELECT_ACCOUNT, {"account_id": account_id}).first() is None:
                    raise not_found(f"account {account_id}")
                rows = conn.execute(_SELECT_ACCOUNT_QUOTES, {"account_id": account_id}).all()
        return {
            "drafted": len(rows),
            "sent": sum(1 for row in rows if row.status == QuoteStatus.SENT),
            "quotes": [_quote_json(row) for row in rows],
        }

    def _permissions(self, conn: Connection, user_id: str) -> dict[str, Any]:
        user = _load_user(conn, user_id)
        if user is None:
            raise not_found(f"user {user_id}")
        team = conn.execute(_SELECT_TEAM, {"user_id": user_id}).scalars().all()
        return _permissions_json(user, team)

    # --- admin writes ---------------------------------------------------------------

    def patch_account(self, account_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change an account's ``credit_hold`` and/or ``discount_tier``."""
        with self._writer.begin() as conn:
            tier = changes.get("discount_tier")
            if tier is not None and conn.execute(_SELECT_TIER_PCT, {"tier": tier}).first() is None:
                raise SandboxError(422, "unknown_tier", f"unknown discount tier {tier!r}")
            if changes:
                conn.execute(update(accounts).where(accounts.c.id == account_id).values(**changes))
            row = conn.execute(_SELECT_ACCOUNT, {"account_id": account_id}).first()
            if row is None:
                raise not_found(f"account {account_id}")
        log.info("account changed", extra={"action": "patch_account", "account_id": account_id})
        return _account_json(row)

    def patch_permissions(self, user_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change any of a user's permission fields; accounts must exist."""
        with self._writer.begin() as conn:
            changes = dict(changes)
            if "accounts" in changes:
                granted = list(dict.fromkeys(changes["accounts"]))  # dedupe, keep order
                known = conn.execute(_COUNT_ACCOUNTS_IN, {"ids": granted}).scalar_one()
                if known != len(granted):
                    raise SandboxError(422, "unknown_account", "accounts lists an unknown id")
                changes["accounts"] = granted
            if changes:
                conn.execute(update(users).where(users.c.id == user_id).values(**changes))
            result = self._permissions(conn, user_id)
        log.info("permissions changed", extra={"action": "patch_permissions", "user": user_id})
        return result

    # --- idempotent business writes ---------------------------------------------------

    def create_quote(
        self, request: KeyedRequest, *, account_id: str, sku: str, quantity: int
    ) -> WriteResult:
        """Draft a one-line quote priced at the account's current tier (201)."""

        def write(conn: Connection, user: User) -> tuple[int, str, dict[str, Any]]:
            if not user.can_draft_quotes:
                raise forbidden(f"user {user.id} may not draft quotes")
            if account_id not in user.accounts:
                raise forbidden(f"account {account_id} is not one of {user.id}'s accounts")
            account = _visible_account(conn, user, account_id)
            line = {"sku": sku, "quantity": quantity}
            lines = _price_lines(conn, [line], account.discount_pct)
            seq = conn.execute(_NEXT_QUOTE_SEQ).scalar_one()
            quote_id = f"Q-{seq}"
            conn.execute(
                _INSERT_QUOTE,
                {
                    "seq": seq,
                    "quote_id": quote_id,
                    "account_id": account_id,
                    "lines": lines,
                    "discount_tier": account.discount_tier,
                    "discount_pct": account.discount_pct,
                    "total_cents": _total_cents(lines),
                    "status": QuoteStatus.DRAFT,
                    "created_by": user.id,
                    "created_key": request.key,
                    "created_at": _now(),
                },
            )
            return 201, quote_id, _quote_json(_load_quote(conn, quote_id))

        return self._idempotent(request, Action.CREATED, write)

    def send_quote(self, request: KeyedRequest, *, quote_id: str) -> WriteResult:
        """Send a draft, re-priced at the account's current tier (200)."""

        def write(conn: Connection, user: User) -> tuple[int, str, dict[str, Any]]:
            row = _load_quote(conn, quote_id)
            if not user.can_send_quotes:
                raise forbidden(f"user {user.id} may not send quotes")
            if row.account_id not in user.accounts:
                raise forbidden(f"account {row.account_id} is not one of {user.id}'s accounts")
            if row.status == QuoteStatus.SENT:
                raise SandboxError(409, "already_sent", f"quote {quote_id} was already sent")
            account = _visible_account(conn, user, row.account_id)
            if account.credit_hold:
                raise SandboxError(409, "credit_hold", f"account {account.id} is on credit hold")
            lines = _price_lines(conn, row.lines, account.discount_pct)
            sent = conn.execute(
                _SEND_QUOTE,
                {
                    "b_quote_id": quote_id,
                    "lines": lines,
                    "discount_tier": account.discount_tier,
                    "discount_pct": account.discount_pct,
                    "total_cents": _total_cents(lines),
                    "sent_by": user.id,
                    "sent_key": request.key,
                    "sent_at": _now(),
                },
            )
            if sent.rowcount != 1:
                raise SandboxError(409, "already_sent", f"quote {quote_id} was already sent")
            return 200, quote_id, _quote_json(_load_quote(conn, quote_id))

        return self._idempotent(request, Action.SENT, write)

    def _idempotent(self, request: KeyedRequest, action: Action, write: _Write) -> WriteResult:
        """Run ``write`` once per key; a repeat of the same request gets the first response.

        The key's record is inserted in the write's own transaction, so either both the
        write and its record are committed or neither is. Only writes that succeeded are
        recorded: a refused request changed nothing and may be retried with its key.
        """
        with self._writer.begin() as conn:
            prior = conn.execute(_SELECT_KEY, {"key": request.key}).first()
            if prior is not None:
                if (prior.method_path, prior.body_hash) != (
                    request.method_path,
                    request.body_hash,
                ):
                    raise SandboxError(
                        422,
                        "idempotency_key_reuse",
                        f"idempotency key {request.key!r} was used for a different request",
                    )
                return WriteResult(status=prior.status_code, body=prior.response, replayed=True)
            user = _load_user(conn, request.user_id)
            if user is None:
                raise SandboxError(401, "unauthenticated", f"unknown user {request.user_id!r}")
            status, quote_id, body = write(conn, user)
            conn.execute(
                _INSERT_KEY,
                {
                    "key": request.key,
                    "method_path": request.method_path,
                    "body_hash": request.body_hash,
                    "user_id": request.user_id,
                    "action": action,
                    "quote_id": quote_id,
                    "status_code": status,
                    "response": body,
                    "created_at": _now(),
                },
            )
        log.info(
            "quote %s %s",
            quote_id,
            action,
            extra={"action": action, "quote_id": quote_id, "user": request.user_id},
        )
        return WriteResult(status=status, body=body, replayed=False)
