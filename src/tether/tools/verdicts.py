"""What a tool's guard and reconcile answer: a guard's verdict on a call, and what
reconciling a write whose outcome was not recorded learned of it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class GuardResult:
    """A guard's verdict: ``ok``, or a refusal with its ``reason``."""

    ok: bool
    reason: str | None = None

    @classmethod
    def allow(cls) -> GuardResult:
        return cls(ok=True)

    @classmethod
    def refuse(cls, reason: str) -> GuardResult:
        return cls(ok=False, reason=reason)


class ReconcileKind(str, enum.Enum):
    """What reconciliation learned about a write whose outcome was not recorded."""

    FOUND = "found"  # it took effect; ``result`` is what it returned
    ABSENT = "absent"  # confirmed: it did not take effect
    UNKNOWN = "unknown"  # cannot tell
    UNREACHABLE = "unreachable"  # could not ask now (the downstream is down): ask again later


@dataclass(frozen=True, kw_only=True)
class Reconciled:
    """The answer of a tool's ``reconcile(key, ctx)``."""

    kind: ReconcileKind
    result: Any = None

    @classmethod
    def found(cls, result: Any) -> Reconciled:
        return cls(kind=ReconcileKind.FOUND, result=result)

    @classmethod
    def absent(cls) -> Reconciled:
        return cls(kind=ReconcileKind.ABSENT)

    @classmethod
    def unknown(cls, reason: str = "") -> Reconciled:
        return cls(kind=ReconcileKind.UNKNOWN, result=reason)

    @classmethod
    def unreachable(cls, reason: str = "") -> Reconciled:
        return cls(kind=ReconcileKind.UNREACHABLE, result=reason)
