"""Suspension notices: who is asked to approve what, with the token to do it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Notice:
    """A suspension notice. It holds only what the run's owner may see, rendered from the
    stored tool call and its preview, never from the model's prose."""

    run_id: str
    user_id: str
    token: str
    approve_url: str
    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    expires_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "token": self.token,
            "approve_url": self.approve_url,
            "tool": self.tool,
            "arguments": self.arguments,
            "preview": self.preview,
            "expires_at": self.expires_at,
        }


class Notifier(Protocol):
    """Where suspension notices go. ``send`` returns False (or raises) when the notice
    was not delivered; the reaper then re-issues it with a fresh token."""

    async def send(self, notice: Notice) -> bool | None: ...


class LogNotifier:
    """Writes notices to the log (the default when no webhook is configured)."""

    async def send(self, notice: Notice) -> None:
        log.info(
            "approval requested",
            extra={
                "action": "suspension_notice",
                "run_id": notice.run_id,
                "tool": notice.tool,
                "approve_url": notice.approve_url,
                "expires_at": notice.expires_at,
            },
        )


class MemoryNotifier:
    """Keeps notices in a list; for tests, the demo and scripts."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    async def send(self, notice: Notice) -> None:
        self.notices.append(notice)

    def last(self, run_id: str | None = None) -> Notice:
        """The latest notice (for ``run_id`` if given)."""
        for notice in reversed(self.notices):
            if run_id is None or notice.run_id == run_id:
                return notice
        raise LookupError(f"no notice for run {run_id}")
