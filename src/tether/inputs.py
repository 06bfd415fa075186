"""Validation of what callers pass in, in one place: bad input gets a clear error and
never reaches the database (a NUL byte or a lone surrogate would be a driver error)."""

from __future__ import annotations

import re
from typing import Any

from tether.errors import (
    InvalidInput,
    NotFound,
    UnknownOrExpired,
)

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOKEN = re.compile(r"[A-Za-z0-9_-]{1,200}")
USER_ID = re.compile(r"[A-Za-z0-9_.@-]{1,128}")
# ASCII digits only: ``str.isdigit`` also accepts ``²`` and ``①`` (which ``int`` refuses) and
# other scripts' digits (which ``int`` reads, so ``٣`` would mean 3).
SEQ = re.compile(r"[0-9]{1,18}")


def run_id(value: Any) -> str:
    """A well-formed run id; anything else cannot name a run: ``not_found``."""
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        raise NotFound("no such run")
    return value


def token(value: Any) -> str:
    """A well-formed approval token; anything else is ``unknown_or_expired``."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise UnknownOrExpired("this approval link is unknown or has expired")
    return value


def user_id(value: Any, what: str = "user_id") -> str:
    """A user id: 1-128 letters, digits or ``. _ @ -``."""
    if not isinstance(value, str) or not USER_ID.fullmatch(value):
        raise InvalidInput(f"{what} must be 1-128 letters, digits or . _ @ -")
    return value


def text(value: Any, what: str, max_chars: int) -> str:
    """Non-blank text of at most ``max_chars``, storable as UTF-8 on both backends."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string")
    if len(value) > max_chars:
        raise InvalidInput(f"{what} is longer than {max_chars} characters")
    if "\x00" in value:
        raise InvalidInput(f"{what} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} is not valid Unicode text") from exc
    return value


def after_seq(value: Any) -> int:
    """A SEQ to start after: an integer ≥ 0 (or its decimal string, as HTTP sends it);
    anything else is ``invalid_input``."""
    if isinstance(value, str) and SEQ.fullmatch(value.strip(" \t")):
        return int(value.strip(" \t"))
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidInput(f"after must be a non-negative integer (an event's SEQ), got {value!r:.40}")


MAX_REASON_CHARS = 2000


DIGEST = re.compile(r"[0-9a-f]{64}")
