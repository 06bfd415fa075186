"""What of a run's content may leave the database (reference §20, "No content in logs,
metrics and traces"): the one gate every log line and span goes through.

Content is what people and models wrote or tools returned: questions, messages, tool
arguments and results, previews, decisions' reasons, answers, and the messages of
exceptions (a tool's or a model's may quote any of those). Logs carry it only with
``TETHER_LOG_CONTENT=1`` (``Settings.log_content``), spans only with
``TETHER_OTEL_CONTENT=1`` (``Settings.otel_content``); metric labels never do. Whoever
writes a log line or a span passes the setting that governs it to these functions, so the
rule is in one place: without it a value is left out and an exception is told by its type
and the frames it came through, never by its message.

This module imports nothing of tether's, so every module may use it.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

# An attribute or field of content is bounded: a span or a log line is not the store.
MAX_CHARS = 16000
# A message that would have been written, without the setting that allows it.
LEFT_OUT = "message not logged (TETHER_LOG_CONTENT)"


def shown(value: Any, allowed: bool) -> str | None:
    """``value`` as text (JSON unless it is a string), bounded, when ``allowed``; None
    otherwise (a field or attribute that is None is not written)."""
    if not allowed or value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_CHARS]


def fields(allowed: bool, **values: Any) -> dict[str, str]:
    """The fields of a log line that are content (``extra={..., **fields(allowed,
    answer=...)}``): each ``shown``, none at all when not ``allowed``."""
    if not allowed:
        return {}
    return {key: text for key, value in values.items() if (text := shown(value, True))}


def kind(exc: BaseException) -> str:
    """An exception's type, by its qualified name: never content."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def described(exc: BaseException, allowed: bool, limit: int = 500) -> str:
    """``Type: message`` when ``allowed``, else the type alone."""
    if not allowed:
        return kind(exc)
    return f"{type(exc).__name__}: {exc}"[:limit]


def frames(exc: BaseException) -> str:
    """``exc``'s traceback with each exception (its causes included) told by its type, not
    its message: what an operator needs to find the code, without what it was handed."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    parts = []
    for link in reversed(chain):
        stack = "".join(traceback.format_tb(link.__traceback__))
        head = "Traceback (most recent call last):\n" if stack else ""
        parts.append(f"{head}{stack}{kind(link)} ({LEFT_OUT})")
    return "\n\nwhich led to:\n\n".join(parts)


def failure(exc: BaseException, allowed: bool, **extra: Any) -> dict[str, Any]:
    """The keyword arguments of a log call about ``exc`` (``log.error(msg, **failure(exc,
    settings.log_content, run_id=...))``): ``extra`` with ``error_type``; and when
    ``allowed`` the message (``error``) and the whole traceback (``exc_info``), else the
    traceback's frames without messages (``trace``)."""
    fields = {**extra, "error_type": kind(exc)}
    if allowed:
        fields["error"] = described(exc, True)
        return {"extra": fields, "exc_info": exc}
    fields["trace"] = frames(exc)
    return {"extra": fields}


def db_error(exc: BaseException) -> str:
    """A database error for a log line written where no setting reaches (the store's
    retries and listeners): the driver's type and the first line of its message, never
    the statement nor its parameters (which hold the content being written), nor the
    server's DETAIL (which may quote a row)."""
    origin = exc
    for _ in range(4):  # a retry's wrapper, SQLAlchemy's wrapper, the driver's error
        under = getattr(origin, "orig", None) or origin.__cause__
        if under is None:
            break
        origin = under
    lines = str(origin).strip().splitlines()
    first = lines[0].split("[SQL:")[0].split("[parameters:")[0].strip() if lines else ""
    return f"{type(origin).__name__}: {first}"[:300]
