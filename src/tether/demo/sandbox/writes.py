"""The sandbox CRM's business writes: draft a quote, send it, each once per idempotency key.

Writes run in ``BEGIN IMMEDIATE`` transactions, so two requests carrying the same
idempotency key are serialised and only the first writes; the key's record is inserted in
the same transaction as the write it describes, so a crash after the commit never loses
the record of what was written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine

from tether.demo.sandbox.errors import SandboxError, forbidden
from tether.demo.sandbox.queries import (
    INSERT_KEY,
    INSERT_QUOTE,
    NEXT_QUOTE_SEQ,
    SELECT_KEY,
    SEND_QUOTE,
    load_quote,
    load_user,
    price_lines,
    total_cents,
    visible_account,
)
from tether.demo.sandbox.records import KeyedRequest, User, WriteResult, now, quote_json
from tether.demo.sandbox.schema import Action, QuoteStatus

log = logging.getLogger(__name__)

# A write: (transaction, acting user, idempotency key) -> (HTTP status, quote id, body).
Write = Callable[[Connection, User, str], tuple[int, str, dict[str, Any]]]


def draft_quote(
    conn: Connection, user: User, key: str, *, account_id: str, sku: str, quantity: int
) -> tuple[int, str, dict[str, Any]]:
    """Draft a one-line quote priced at the account's current tier (201)."""
    if not user.can_draft_quotes:
        raise forbidden(f"user {user.id} may not draft quotes")
    if account_id not in user.accounts:
        raise forbidden(f"account {account_id} is not one of {user.id}'s accounts")
    account = visible_account(conn, user, account_id)
    lines = price_lines(conn, [{"sku": sku, "quantity": quantity}], account.discount_pct)
    seq = conn.execute(NEXT_QUOTE_SEQ).scalar_one()
    quote_id = f"Q-{seq}"
    conn.execute(
        INSERT_QUOTE,
        {
            "seq": seq,
            "quote_id": quote_id,
            "account_id": account_id,
            "lines": lines,
            "discount_tier": account.discount_tier,
            "discount_pct": account.discount_pct,
            "total_cents": total_cents(lines),
            "status": QuoteStatus.DRAFT,
            "created_by": user.id,
            "created_key": key,
            "created_at": now(),
        },
    )
    return 201, quote_id, quote_json(load_quote(conn, quote_id))


def send_quote(
    conn: Connection, user: User, key: str, *, quote_id: str
) -> tuple[int, str, dict[str, Any]]:
    """Send a draft, re-priced at the account's current tier (200)."""
    row = load_quote(conn, quote_id)
    if not user.can_send_quotes:
        raise forbidden(f"user {user.id} may not send quotes")
    if row.account_id not in user.accounts:
        raise forbidden(f"account {row.account_id} is not one of {user.id}'s accounts")
    if row.status == QuoteStatus.SENT:
        raise SandboxError(409, "already_sent", f"quote {quote_id} was already sent")
    account = visible_account(conn, user, row.account_id)
    if account.credit_hold:
        raise SandboxError(409, "credit_hold", f"account {account.id} is on credit hold")
    lines = price_lines(conn, row.lines, account.discount_pct)
    sent = conn.execute(
        SEND_QUOTE,
        {
            "b_quote_id": quote_id,
            "lines": lines,
            "discount_tier": account.discount_tier,
            "discount_pct": account.discount_pct,
            "total_cents": total_cents(lines),
            "sent_by": user.id,
            "sent_key": key,
            "sent_at": now(),
        },
    )
    if sent.rowcount != 1:
        raise SandboxError(409, "already_sent", f"quote {quote_id} was already sent")
    return 200, quote_id, quote_json(load_quote(conn, quote_id))


def idempotent(writer: Engine, request: KeyedRequest, action: Action, write: Write) -> WriteResult:
    """Run ``write`` once per key; a repeat of the same request gets the first response.

    The key's record is inserted in the write's own transaction, so either both the
    write and its record are committed or neither is. Only writes that succeeded are
    recorded: a refused request changed nothing and may be retried with its key.
    """
    with writer.begin() as conn:
        prior = conn.execute(SELECT_KEY, {"key": request.key}).first()
        if prior is not None:
            if (prior.method_path, prior.body_hash) != (request.method_path, request.body_hash):
                raise SandboxError(
                    422,
                    "idempotency_key_reuse",
                    f"idempotency key {request.key!r} was used for a different request",
                )
            return WriteResult(status=prior.status_code, body=prior.response, replayed=True)
        user = load_user(conn, request.user_id)
        if user is None:
            raise SandboxError(401, "unauthenticated", f"unknown user {request.user_id!r}")
        status, quote_id, body = write(conn, user, request.key)
        conn.execute(
            INSERT_KEY,
            {
                "key": request.key,
                "method_path": request.method_path,
                "body_hash": request.body_hash,
                "user_id": request.user_id,
                "action": action,
                "quote_id": quote_id,
                "status_code": status,
                "response": body,
                "created_at": now(),
            },
        )
    log.info(
        "quote %s %s",
        quote_id,
        action,
        extra={"action": action, "quote_id": quote_id, "user": request.user_id},
    )
    return WriteResult(status=status, body=body, replayed=False)
