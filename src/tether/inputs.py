"""Validation of what callers pass in, in one place: bad input gets a clear error and
never reaches the database (a NUL byte or a lone surrogate would be a driver error)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tether.errors import (
    InvalidInput,
    NotFound,
    UnknownOrExpired,
)
from tether.runs import RunState

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


_REQUESTS_CURSOR = re.compile(
    r"([0-9]{1,12}(?:\.[0-9]{1,20})?(?:e\+?[0-9]{1,3})?):([A-Za-z0-9_-]{1,64})"
)


def requests_cursor(value: Any) -> tuple[float, str]:
    """A page of open requests' ``after`` cursor (``Inbox.after``: the last request's
    expiry and run id); anything else is ``invalid_input``."""
    found = _REQUESTS_CURSOR.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise InvalidInput("after must be a page's `after` cursor (the page before's last)")
    return float(found.group(1)), found.group(2)


def thread_id(value: Any, *, missing: bool = False) -> str:
    """A well-formed thread id. In a request's body anything else is ``invalid_input``;
    where it names the thread to read (``missing``), it cannot name one: ``not_found``."""
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        if missing:
            raise NotFound("no such thread")
        raise InvalidInput("thread_id must be a thread's id (1-64 letters, digits, _ or -)")
    return value


IF_BUSY = ("reject", "enqueue")


def if_busy(value: Any) -> bool:
    """Whether a follow-up to a busy thread is queued (``"enqueue"``) rather than refused
    (``"reject"``, the default); anything else is ``invalid_input``."""
    if value not in IF_BUSY or not isinstance(value, str):
        raise InvalidInput(f'if_busy must be "reject" or "enqueue", got {value!r:.40}')
    return value == "enqueue"


# An Idempotency-Key (reference §14): printable ASCII, space included.
IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,255}")


# Claim order (reference §13): higher first.
PRIORITIES = range(-10, 11)


def priority(value: Any) -> int:
    """A run's priority: a whole number from -10 to 10 (not a bool, a float or a string);
    None is the default, 0."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITIES:
        raise InvalidInput("priority must be a whole number from -10 to 10")
    return int(value)


def max_priority(value: Any) -> int:
    """A user's priority bound (``--max-priority``, reference §13): a whole number from -10
    to 10."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in PRIORITIES:
        raise InvalidInput("max priority must be a whole number from -10 to 10")
    return int(value)


MAX_RETENTION_DAYS = 1_000_000.0


def retention_days(value: Any) -> float:
    """A user's own retention (``--retention-days``, reference §20): days, decimals
    allowed, more than 0 and at most ``MAX_RETENTION_DAYS``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput("retention days must be a number of days")
    if not 0 < value <= MAX_RETENTION_DAYS:  # NaN fails both comparisons
        raise InvalidInput(
            f"retention days must be more than 0 and at most {MAX_RETENTION_DAYS:,.0f}"
        )
    return float(value)


def start_at(value: Any) -> float | None:
    """When a run may start, as epoch seconds: an ISO-8601 time with a UTC offset (a
    string, or an aware ``datetime``) that exists in UTC (years 1 to 9999 there); None: at
    once. A naive time is refused, since no clock here may guess its zone."""
    if value is None:
        return None
    when = value
    if isinstance(value, str):
        storable(value, "start_at")  # fromisoformat reads past a NUL at the end
        try:
            when = datetime.fromisoformat(value) if len(value) <= 64 else None
        except ValueError:
            when = None
    if not isinstance(when, datetime) or when.utcoffset() is None:
        raise InvalidInput(
            "start_at must be an ISO-8601 time with a UTC offset, such as "
            "2026-12-07T09:00:00+01:00 or 2026-12-07T08:00:00Z"
        )
    try:
        return when.astimezone(UTC).timestamp()
    except (OverflowError, ValueError):  # 0001-01-01T00:00+00:01 is in year 0 in UTC
        raise InvalidInput("start_at must be a time between the years 1 and 9999 in UTC") from None


def idempotency_key(value: Any) -> str:
    """An ``Idempotency-Key``: 1-255 printable ASCII characters (0x20-0x7E); anything
    else, an empty key included, is ``invalid_input``."""
    if not isinstance(value, str) or not IDEMPOTENCY_KEY.fullmatch(value):
        raise InvalidInput("Idempotency-Key must be 1-255 printable ASCII characters")
    return value


def token(value: Any) -> str:
    """A well-formed approval token; anything else is ``unknown_or_expired``."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise UnknownOrExpired("this approval link is unknown or has expired")
    return value


def run_state(value: Any) -> RunState:
    """One of the states of a run, by its stored name; anything else is ``invalid_input``."""
    try:
        return RunState(value)
    except ValueError:
        names = ", ".join(state.value for state in RunState)
        raise InvalidInput(f"state must be one of {names}, got {value!r:.40}") from None


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
    storable(value, what)
    return value


# What neither backend can keep as text: NUL (PostgreSQL refuses it in text and jsonb
# alike, SQLite would keep it and hand back what no other path accepts) and lone
# surrogates (not Unicode: they have no UTF-8). Searched for in one pass, without a copy.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def storable(value: Any, what: str) -> None:
    """Refuse (``invalid_input``, saying where) a NUL character or a lone surrogate in
    ``value``: a string, or any string or key of its mappings and lists at any depth (a
    JSON body, edited arguments, an engine method's arguments). Other values pass."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    seen: set[int] = set()  # a structure that holds itself is walked once
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _refuse_unstorable(item, what, path)
        elif isinstance(item, Mapping | list | tuple) and id(item) not in seen:
            seen.add(id(item))
            if isinstance(item, Mapping):
                for key, inner in item.items():
                    if isinstance(key, str):
                        _refuse_unstorable(key, what, path, key=True)
                    stack.append((inner, (*path, str(key))))
            else:
                stack.extend((inner, (*path, n)) for n, inner in enumerate(item))


def _refuse_unstorable(
    text: str, what: str, path: tuple[str | int, ...], *, key: bool = False
) -> None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    where = f"{where[:200]} in {what}" if where else what  # "arguments.item in decisions"
    if key:
        where = f"a key of {where}"
    if found.group() == "\x00":
        raise InvalidInput(f"{where} must not contain NUL characters")
    raise InvalidInput(f"{where} is not valid Unicode text (it holds a lone surrogate)")


def after_seq(value: Any) -> int:
    """A SEQ to start after: an integer ≥ 0 (or its decimal string, as HTTP sends it);
    anything else is ``invalid_input``."""
    if isinstance(value, str) and SEQ.fullmatch(value.strip(" \t")):
        return int(value.strip(" \t"))
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidInput(f"after must be a non-negative integer (an event's SEQ), got {value!r:.40}")


def flag(value: Any, name: str) -> bool:
    """A yes/no query parameter: ``1``/``true`` or ``0``/``false`` (a bool from Python);
    anything else is ``invalid_input``."""
    if isinstance(value, bool):
        return value
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise InvalidInput(f"{name} must be 1, true, 0 or false, got {value!r:.40}")


MAX_REASON_CHARS = 2000
MAX_QUESTION_CHARS = 100_000


DIGEST = re.compile(r"[0-9a-f]{64}")


# Bounds of every JSON text tether parses from a caller (a request body, a form's JSON
# field): nesting deeper than this is refused before it can exhaust Python's recursion
# limit, which the standard parser meets at about a thousand levels (as a 500).
MAX_JSON_DEPTH = 100
MAX_JSON_CHARS = 256 * 1024


def json_value(text: str | bytes, what: str, *, max_chars: int = MAX_JSON_CHARS) -> Any:
    """``text`` read as one JSON value, bounded in size and depth: ``invalid_input`` for
    text that is not JSON (``NaN`` and ``Infinity`` are not), too long, nested deeper
    than ``MAX_JSON_DEPTH``, or holding a string no backend can store (``storable``)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{what} is not UTF-8 text") from exc
    if len(text) > max_chars:
        raise InvalidInput(f"{what} is longer than {max_chars} characters")
    if _depth(text) > MAX_JSON_DEPTH:
        raise InvalidInput(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise InvalidInput(f"{what} is not valid JSON ({exc})") from exc
    except RecursionError as exc:  # malformed text the depth count did not see as deep
        raise InvalidInput(f"{what} is nested too deeply") from exc
    storable(value, what)  # "\u0000" is JSON, but no backend stores it
    return value


_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text, counted without recursion
    (brackets inside strings do not count); malformed text is left to the parser."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    """JSON has no NaN or Infinity, though Python's reader takes them."""
    raise ValueError(f"{name} is not a JSON value")
