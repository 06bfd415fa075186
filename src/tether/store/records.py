"""Records the store returns besides the run itself: ledger entries, decisions, events,
and a creation request by its ``Idempotency-Key``."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.runs import Run


class CallStatus(str, enum.Enum):
    """A ledger entry's status, as Jepsen records operations; the stored string."""

    # Written with the assistant turn, before the tool runs.
    INTENT = "intent"
    # The tool returned a result.
    OK = "ok"
    # The tool failed definitely (it did not take effect), or was refused before running.
    ERROR = "error"
    # The call failed ambiguously (timeout, dropped connection, 5xx): it may have taken
    # effect. Reconciled before the loop goes on.
    UNKNOWN = "unknown"
    # A write in a dry run (reference §12): never executed; its result is the call it would make.
    SKIPPED = "skipped"


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """One tool call in the ledger, keyed by ``"{run_id}:{tool_call_id}"``."""

    idempotency_key: str
    run_id: str
    tool_call_id: str
    seq: int
    tool: str
    arguments: dict[str, Any]
    effect: str
    status: CallStatus
    # The result the model saw for the call, for every outcome: a tool's answer, an
    # error's ``{"error", "message"}``, a dry run's ``would_call`` (read from the call's
    # result message, which alone stores it); None while it is an intent; for a call
    # failed ``unknown``, which has no result message, why it is unknown.
    result: Any
    intent_at: float
    outcome_at: float | None
    # The arguments the call ran with when an approver edited the model's (reference §9).
    edited_arguments: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> LedgerEntry:
        return cls(
            idempotency_key=row["idempotency_key"],
            run_id=row["run_id"],
            tool_call_id=row["tool_call_id"],
            seq=row["seq"],
            tool=row["tool"],
            arguments=dict(row["arguments"]),
            effect=row["effect"],
            status=CallStatus(row["status"]),
            result=row["result"],
            intent_at=row["intent_at"],
            outcome_at=row["outcome_at"],
            edited_arguments=row["edited_arguments"],
        )


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A human decision that used a token: what, who, when (DB clock), the digest of the
    preview the approver saw, their reason, and the arguments the call is to run with when
    they are not the model's (an approver's edit, reference §9)."""

    run_id: str
    tool_call_id: str
    decision: str
    by: str
    at: float
    digest: str | None
    reason: str | None = None
    arguments: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Decision:
        return cls(
            run_id=row["run_id"],
            tool_call_id=row["tool_call_id"],
            decision=row["decision"],
            by=row["decided_by"],
            at=row["decided_at"],
            digest=row["digest"],
            reason=row["reason"],
            arguments=row["arguments"],
        )


@dataclass(frozen=True, kw_only=True)
class Event:
    """One entry of the human trace. Never used to rebuild state (invariant 1)."""

    id: int
    run_id: str
    at: float
    kind: str
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Event:
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            at=row["at"],
            kind=row["kind"],
            data=dict(row["data"]),
        )


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """A creation request stored by its user's ``Idempotency-Key`` (reference §14): the
    SHA-256 of its body's canonical JSON, the answer first sent (``status`` and
    ``response``, the ``{"id", "state"}`` of the creation) and its run as it is now."""

    key: str
    digest: str
    status: int
    response: dict[str, Any]
    run: Run


@dataclass(frozen=True, kw_only=True)
class ChildOf:
    """Where a child run sits in its tree (reference §18): the run and tool call that
    start it, the tree's root, and its own depth."""

    run_id: str
    tool_call_id: str
    root_run_id: str
    depth: int
    order: int = 0

    def columns(self) -> dict[str, Any]:
        """The child's columns of ``runs`` that place it in its tree."""
        return {
            "root_run_id": self.root_run_id,
            "parent_run_id": self.run_id,
            "parent_tool_call_id": self.tool_call_id,
            "depth": self.depth,
            "child_order": self.order,
        }
