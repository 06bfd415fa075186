"""The user's scope (permissions), resolved now rather than trusted from a snapshot.

A run stores a snapshot with the time it was taken; every resumption re-resolves it
(invariant 7), because acting on an hour-old permission is a stale grant. Who may decide
a user's pending calls is read from two scopes, both resolved when the decision arrives:
the owner's names people and groups (``"group:NAME"``), the approver's lists the groups
the approver belongs to (reference §19).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "group:"


@dataclass(frozen=True, kw_only=True)
class Scope:
    """What ``user_id`` may do now: free-form ``permissions`` a tool reads, who besides
    the user may approve the user's pending calls (``approvers``: user names and
    ``"group:NAME"``), and the groups the user belongs to (``groups``)."""

    user_id: str
    permissions: Mapping[str, Any] = field(default_factory=dict)
    approvers: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # A resolver may hand over lists or sets: stored as frozensets of strings.
        object.__setattr__(self, "approvers", frozenset(str(a) for a in self.approvers))
        object.__setattr__(self, "groups", frozenset(str(g) for g in self.groups))

    @property
    def names_groups(self) -> bool:
        """Whether ``approvers`` names any group (then the approver's scope is needed)."""
        return any(a.startswith(GROUP) for a in self.approvers)

    def may_approve(self, approver: str, groups: Iterable[str] = ()) -> bool:
        """Whether ``approver``, a member of ``groups`` (by the approver's own scope,
        resolved now), may decide this user's pending calls."""
        return approver == self.user_id or names(self.approvers, approver, groups)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "user_id": self.user_id,
            "permissions": dict(self.permissions),
            "approvers": sorted(self.approvers),
        }
        if self.groups:
            data["groups"] = sorted(self.groups)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scope:
        return cls(
            user_id=str(data["user_id"]),
            permissions=dict(data.get("permissions") or {}),
            approvers=frozenset(data.get("approvers") or ()),
            groups=frozenset(data.get("groups") or ()),
        )


def names(listed: Iterable[str], person: str, groups: Iterable[str]) -> bool:
    """Whether ``listed`` (user names and ``"group:NAME"``) names ``person`` or one of the
    ``groups`` ``person`` belongs to."""
    listed = frozenset(listed)
    return person in listed or any(f"{GROUP}{g}" in listed for g in groups)


ScopeResolver = Callable[[str], Awaitable[Scope]]


async def open_scope(user_id: str) -> Scope:
    """A resolver that grants every user an empty scope; for agents without permissions."""
    return Scope(user_id=user_id)
