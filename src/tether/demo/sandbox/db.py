"""The sandbox CRM's store: every read and admin write over one SQLite engine, and the
business writes (``writes``) run once per idempotency key."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine, func, select, update

from tether.demo.sandbox import queries as q
from tether.demo.sandbox import writes
from tether.demo.sandbox.errors import SandboxError, not_found
from tether.demo.sandbox.records import (
    KeyedRequest,
    User,
    WriteResult,
    account_json,
    amount,
    lines_json,
    permissions_json,
    quote_json,
    unit_price_cents,
)
from tether.demo.sandbox.schema import (
    Action,
    QuoteStatus,
    accounts,
    metadata,
    open_engine,
    users,
    writer,
)
from tether.demo.sandbox.seed import insert_seed

__all__ = ["KeyedRequest", "SandboxStore", "User", "WriteResult"]

log = logging.getLogger(__name__)


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
            return q.load_user(conn, user_id)

    def permissions(self, user_id: str) -> dict[str, Any]:
        """The user's permissions, team included (404 for an unknown user)."""
        with self._engine.connect() as conn:
            return self._permissions(conn, user_id)

    def search_accounts(self, user: User, query: str) -> list[dict[str, Any]]:
        """The user's accounts whose name contains ``query`` (any case) or whose id is it."""
        text = query.strip()
        with self._engine.connect() as conn:
            rows = conn.execute(
                q.SEARCH_ACCOUNTS,
                {"ids": list(user.accounts), "query": text, "needle": text.lower()},
            ).all()
        return [account_json(row) for row in rows]

    def account(self, user: User, account_id: str) -> dict[str, Any]:
        """One of the user's accounts (404 otherwise)."""
        with self._engine.connect() as conn:
            return account_json(q.visible_account(conn, user, account_id))

    def price(self, user: User, account_id: str, sku: str, quantity: int) -> dict[str, Any]:
        """``quantity`` of ``sku`` priced at the account's current discount tier."""
        with self._engine.connect() as conn:
            account = q.visible_account(conn, user, account_id)
            list_cents = q.list_prices(conn, [sku])[sku]
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
            row = q.load_quote(conn, quote_id)
            if row.account_id not in user.accounts:
                raise not_found(f"quote {quote_id}")
            return quote_json(row)

    def preview(self, user: User, quote_id: str) -> dict[str, Any]:
        """The quote re-rendered at the account's current tier: what a send now would send."""
        with self._engine.connect() as conn:
            row = q.load_quote(conn, quote_id)
            if row.account_id not in user.accounts:
                raise not_found(f"quote {quote_id}")
            account = q.visible_account(conn, user, row.account_id)
            lines = q.price_lines(conn, row.lines, account.discount_pct)
        return {
            "quote_id": row.quote_id,
            "account_id": row.account_id,
            "account_name": account.name,
            "lines": lines_json(lines),
            "discount_tier": account.discount_tier,
            "discount_pct": account.discount_pct,
            "total": amount(q.total_cents(lines)),
        }

    def by_key(self, key: str) -> dict[str, Any]:
        """The quote created or sent with idempotency key ``key`` (what reconcile asks)."""
        with self._engine.connect() as conn:
            record = conn.execute(q.SELECT_KEY, {"key": key}).first()
            if record is None:
                raise not_found(f"write with idempotency key {key!r}")
            quote = q.load_quote(conn, record.quote_id)
        return {
            "action": record.action,
            "quote": quote_json(quote),
            "response": {"status": record.status_code, "body": record.response},
        }

    def admin_quotes(self, account_id: str | None) -> dict[str, Any]:
        """Quote counts and quotes, for one account or all."""
        with self._engine.connect() as conn:
            if account_id is None:
                rows = conn.execute(q.SELECT_ALL_QUOTES).all()
            else:
                if conn.execute(q.SELECT_ACCOUNT, {"account_id": account_id}).first() is None:
                    raise not_found(f"account {account_id}")
                rows = conn.execute(q.SELECT_ACCOUNT_QUOTES, {"account_id": account_id}).all()
        return {
            "drafted": len(rows),
            "sent": sum(1 for row in rows if row.status == QuoteStatus.SENT),
            "quotes": [quote_json(row) for row in rows],
        }

    def _permissions(self, conn: Connection, user_id: str) -> dict[str, Any]:
        user = q.load_user(conn, user_id)
        if user is None:
            raise not_found(f"user {user_id}")
        team = conn.execute(q.SELECT_TEAM, {"user_id": user_id}).scalars().all()
        return permissions_json(user, team)

    # --- admin writes ---------------------------------------------------------------

    def patch_account(self, account_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change an account's ``credit_hold`` and/or ``discount_tier``."""
        with self._writer.begin() as conn:
            tier = changes.get("discount_tier")
            if tier is not None and conn.execute(q.SELECT_TIER_PCT, {"tier": tier}).first() is None:
                raise SandboxError(422, "unknown_tier", f"unknown discount tier {tier!r}")
            if changes:
                conn.execute(update(accounts).where(accounts.c.id == account_id).values(**changes))
            row = conn.execute(q.SELECT_ACCOUNT, {"account_id": account_id}).first()
            if row is None:
                raise not_found(f"account {account_id}")
        log.info("account changed", extra={"action": "patch_account", "account_id": account_id})
        return account_json(row)

    def patch_permissions(self, user_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change any of a user's permission fields; accounts must exist."""
        with self._writer.begin() as conn:
            changes = dict(changes)
            if "accounts" in changes:
                granted = list(dict.fromkeys(changes["accounts"]))  # dedupe, keep order
                known = conn.execute(q.COUNT_ACCOUNTS_IN, {"ids": granted}).scalar_one()
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
        write = partial(writes.draft_quote, account_id=account_id, sku=sku, quantity=quantity)
        return writes.idempotent(self._writer, request, Action.CREATED, write)

    def send_quote(self, request: KeyedRequest, *, quote_id: str) -> WriteResult:
        """Send a draft, re-priced at the account's current tier (200)."""
        write = partial(writes.send_quote, quote_id=quote_id)
        return writes.idempotent(self._writer, request, Action.SENT, write)
