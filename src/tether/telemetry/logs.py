"""Structured logs: one JSON object a line, with ``run_id``, ``action`` and ``state``.

The handlers ``configure`` sets up write an exception's traceback without its message
(``content.frames``) unless ``show_content`` allowed content (``TETHER_LOG_CONTENT=1``):
a backstop for what other libraries log (uvicorn's errors, an exporter's), beside tether's
own lines, which leave content out themselves (``content.failure``)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from tether.telemetry import content

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class Redacting(logging.Formatter):
    """A formatter whose tracebacks carry the exceptions' messages only with ``content``."""

    content = False

    def formatException(self, ei: Any) -> str:
        if self.content or ei[1] is None:
            return super().formatException(ei)
        return content.frames(ei[1])

    def format(self, record: logging.LogRecord) -> str:
        record.exc_text = None  # another handler's text may hold what this one leaves out
        return super().format(record)


class JsonFormatter(Redacting):
    """Formats a record and its ``extra`` fields as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class Without(logging.Filter):
    """Drops the records of some ``action``s: what a command reports in its own words."""

    def __init__(self, actions: frozenset[str]) -> None:
        super().__init__()
        self.actions = actions

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "action", None) not in self.actions


class Stamp(logging.Filter):
    """Adds the same fields to every record: what tells one process's lines from its
    siblings' on a shared output (``tether worker --processes N``)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            setattr(record, key, value)
        return True


def stamp(**fields: Any) -> None:
    """From now on, every line the handlers ``configure`` set up write carries ``fields``."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(Stamp(fields))


def leave_out(*actions: str) -> None:
    """From now on, the log handlers ``configure`` set up drop the records of ``actions``."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(Without(frozenset(actions)))


def show_content(allowed: bool) -> None:
    """From now on, the handlers ``configure`` set up write exceptions' messages in their
    tracebacks only if ``allowed`` (``Settings.log_content``)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, Redacting):
            handler.formatter.content = allowed


def configure(level: str = "INFO", *, json_lines: bool = True) -> None:
    """Send tether's logs to stderr, as JSON lines unless ``json_lines`` is False."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else Redacting("%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "uvicorn.access", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
