"""The user's scope (permissions), resolved now rather than trusted from a snapshot.

A run stores a snapshot with the time it was taken; every resumption re-resolves it
(invariant 7), because acting on an hour-old permission is a stale grant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What ``user_id`` may do now: free-form ``permissions`` a tool reads, and who besides
    the user may approve the user's pending calls."""

    user_id: str
    permissions: Mapping[str, Any] = field(default_factory=dict)
    approvers: frozenset[str] = frozenset()

    def may_approve(self, approver: str) -> bool:
        """Whether ``approver`` may decide this user's pending calls."""
        return approver == self.user_id or approver in self.approvers

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "permissions": dict(self.permissions),
            "approvers": sorted(self.approvers),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scope:
        return cls(
            user_id=str(data["user_id"]),
            permissions=dict(data.get("permissions") or {}),
            approvers=frozenset(data.get("approvers") or ()),
        )


ScopeResolver = Callable[[str], Awaitable[Scope]]


async def open_scope(user_id: str) -> Scope:
    """A resolver that grants every user an empty scope; for agents without permissions."""
    return Scope(user_id=user_id)
