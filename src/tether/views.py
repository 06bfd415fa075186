"""What the engine hands back to callers beside runs: a run with its messages, and the
report of a reaper pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.models.base import Message
from tether.runs import Run

__all__ = ["ReapReport", "RunView"]


@dataclass(frozen=True, kw_only=True)
class RunView:
    """A run with its messages, as a caller reads it."""

    run: Run
    messages: list[Message]

    @property
    def output(self) -> Any:
        """The validated typed output as stored (JSON), or None (SPEC §11)."""
        return self.run.output


@dataclass(frozen=True, kw_only=True)
class ReapReport:
    """One reaper pass: what was recovered, stopped, expired, re-notified and purged."""

    recovered: list[str]
    stopped: dict[str, str]
    expired: list[str]
    notices_reissued: list[str]
    purged: int

    def to_json(self) -> dict[str, Any]:
        return {
            "recovered": self.recovered,
            "stopped": self.stopped,
            "expired": self.expired,
            "notices_reissued": self.notices_reissued,
            "purged": self.purged,
        }
