"""The one mapping from a domain error's ``code`` to its HTTP status, and the body of a
refusal (reference §6): domain errors know nothing of HTTP, the API decides here."""

from __future__ import annotations

from typing import Any

# Every code a request can meet; one that is missing answers DEFAULT_STATUS.
STATUS: dict[str, int] = {
    "invalid_input": 422,
    "unauthenticated": 401,
    "not_found": 404,
    "unknown_or_expired": 404,
    "no_longer_permitted": 403,
    "four_eyes": 403,
    "not_halted": 409,
    "halted_by_ancestor": 409,
    "already_finished": 409,
    "already_resumed": 409,
    "already_decided": 409,
    "changed": 409,
    "guard_failed": 409,
    "illegal_transition": 409,
    "lease_lost": 409,
    "wrong_version": 409,
    "tool_unavailable": 409,
    "thread_busy": 409,
    "idempotency_mismatch": 409,
    "request_timeout": 408,
    "payload_too_large": 413,
    "too_many_attempts": 429,
    "too_many_streams": 429,
    "failpoint": 500,
    "internal_error": 500,
    "model_error": 502,
    "not_ready": 503,
    "database_unavailable": 503,
    "database_misconfigured": 503,
    "schema_not_ready": 503,
    "sandbox_unavailable": 503,
    "scope_unavailable": 503,
    # invalid_config, tool_error, outcome_unknown, invalid_arguments: the default.
}
DEFAULT_STATUS = 400


def status_for(code: str) -> int:
    """The HTTP status that answers a refusal with ``code``."""
    return STATUS.get(code, DEFAULT_STATUS)


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """A refusal as reference §6 shapes it: ``{"ok": false, "error": CODE, "message": TEXT}``."""
    return {"ok": False, "error": code, "message": message, **details}
