"""The HTTP statuses of error codes are the API's (``tether.api.statuses.STATUS``): domain
errors carry only their code, and every published code keeps its status."""

from __future__ import annotations

import pytest

from tether import errors
from tether.api.statuses import DEFAULT_STATUS, STATUS, status_for

# The statuses reference §6 clients rely on; a change here is a breaking change of the API.
PUBLISHED = {
    "halted_by_ancestor": 409,
    "wrong_version": 409,
    "four_eyes": 403,
    "tool_unavailable": 409,
    "thread_busy": 409,
    "idempotency_mismatch": 409,
    "database_unavailable": 503,
    "database_misconfigured": 503,
    "invalid_input": 422,
    "unauthenticated": 401,
    "invalid_config": 400,
    "schema_not_ready": 503,
    "not_ready": 503,
    "not_found": 404,
    "not_halted": 409,
    "already_finished": 409,
    "illegal_transition": 409,
    "lease_lost": 409,
    "model_error": 502,
    "failpoint": 500,
    "unknown_or_expired": 404,
    "already_resumed": 409,
    "already_decided": 409,
    "no_longer_permitted": 403,
    "changed": 409,
    "guard_failed": 409,
    "sandbox_unavailable": 503,
    "scope_unavailable": 503,
    "tool_error": 400,
    "payload_too_large": 413,
    "request_timeout": 408,
    "too_many_attempts": 429,
    "too_many_streams": 429,
    "internal_error": 500,
    "tether_error": 400,
}

DOMAIN_ERRORS = [
    value
    for value in vars(errors).values()
    if isinstance(value, type) and issubclass(value, errors.TetherError)
]


@pytest.mark.parametrize(("code", "status"), sorted(PUBLISHED.items()))
def test_every_published_code_keeps_its_status(code: str, status: int) -> None:
    assert status_for(code) == status


def test_an_unmapped_code_is_a_400() -> None:
    assert "no_such_code" not in STATUS
    assert status_for("no_such_code") == DEFAULT_STATUS == 400


@pytest.mark.parametrize("error", DOMAIN_ERRORS, ids=lambda e: e.__name__)
def test_domain_errors_carry_a_code_and_no_http_status(error: type[errors.TetherError]) -> None:
    assert not hasattr(error, "http_status")
    assert error.code in PUBLISHED, f"{error.__name__}: publish the status of {error.code!r}"
    body = error("went wrong", extra=1).to_dict()
    assert body == {"ok": False, "error": error.code, "message": "went wrong", "extra": 1}
