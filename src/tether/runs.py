"""The run record, its states, and the one transition table (reference §1)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tether.budget import Budget, Limits


class RunState(str, enum.Enum):
    """States of a run; each value is the string stored in the database."""

    # A follow-up waits for the earlier runs of its thread to stop (reference §14); a
    # worker's claim starts it once none of them is running, suspended or queued.
    QUEUED = "queued"
    # A live owner carries it, or it waits (owner NULL) for a worker to claim it.
    RUNNING = "running"
    # A tool call awaits a human decision; the pending request and token hash are stored.
    SUSPENDED = "suspended"
    # It waits for the child runs its turn started (reference §18): no owner, no lease,
    # not an orphan; the transaction that stops its last child makes it ready again.
    WAITING = "waiting"
    # A budget bound, an expired approval window or lost permission stopped it; the
    # owner may continue it deliberately.
    HALTED = "halted"
    # The model gave its final answer. Terminal.
    ANSWERED = "answered"
    # It cannot go on (unreconcilable write, recovery exhausted, error). Terminal.
    FAILED = "failed"
    # Its owner cancelled it. Terminal.
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({RunState.ANSWERED, RunState.FAILED, RunState.CANCELLED})
# The states that make a thread busy (reference §14), in enum order: a follow-up then
# waits (queued) or is refused, and the thread cannot be deleted.
BUSY = (RunState.QUEUED, RunState.RUNNING, RunState.SUSPENDED, RunState.WAITING)

# Every legal transition, in one place. The store enforces each one as a conditional
# UPDATE whose WHERE clause names the expected state.
TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.RUNNING: frozenset(
        {
            RunState.SUSPENDED,
            RunState.WAITING,
            RunState.HALTED,
            RunState.ANSWERED,
            RunState.FAILED,
            RunState.CANCELLED,
            RunState.RUNNING,  # a new owner claims it (lease epoch + 1)
        }
    ),
    # Its last child stopped (ready for a worker), or its owner cancelled it.
    RunState.WAITING: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.SUSPENDED: frozenset({RunState.RUNNING, RunState.HALTED, RunState.CANCELLED}),
    RunState.HALTED: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.ANSWERED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.CANCELLED: frozenset(),
}


__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Lease",
    "Pending",
    "PendingCall",
    "Run",
    "RunState",
    "answer_of",
    "can_transition",
    "child_to_json",
    "iso",
    "run_to_json",
]


def can_transition(src: RunState, dst: RunState) -> bool:
    """Whether the table allows ``src`` → ``dst``."""
    return dst in TRANSITIONS[src]


@dataclass(frozen=True, kw_only=True)
class Lease:
    """Proof of ownership: every step write is conditional on both fields (invariant 8)."""

    run_id: str
    owner: str
    epoch: int


@dataclass(frozen=True, kw_only=True)
class Pending:
    """The tool call a suspended run waits on, as stored: what the human is asked to approve."""

    tool_call_id: str
    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    digest: str | None
    # The model's arguments when ``arguments`` are an approver's edit of them (reference §9).
    edited_from: dict[str, Any] | None = None
    # How many distinct people approve it (reference §19), asked when it was suspended.
    quorum: int = 1
    # Seconds to its escalation (``escalate_after_min``): stored as a due time, not in JSON.
    escalate_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "tool_call_id": self.tool_call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "preview": self.preview,
            "digest": self.digest,
        }
        if self.edited_from is not None:
            data["edited_from"] = self.edited_from
        if self.quorum != 1:
            data["quorum"] = self.quorum
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pending:
        return cls(
            tool_call_id=data["tool_call_id"],
            tool=data["tool"],
            arguments=dict(data["arguments"]),
            preview=data.get("preview"),
            digest=data.get("digest"),
            edited_from=data.get("edited_from"),
            quorum=int(data.get("quorum") or 1),
        )


@dataclass(frozen=True, kw_only=True)
class PendingCall:
    """One call of a suspension (reference §15): the call as asked, its token's hash (never
    the token), its place in the turn, its decision once recorded (``{"decision", "by",
    "at"}``)."""

    pending: Pending
    token_hash: str
    position: int
    epoch: int
    decided: dict[str, Any] | None = None
    # Whether its notice was delivered (the reaper re-issues one that was not).
    notified: bool = False
    # Its suspension, escalation (database clock) and approvals so far (reference §19).
    suspended_at: float | None = None
    escalated_at: float | None = None
    approvals: tuple[dict[str, Any], ...] = ()

    def to_json(self, expires_at: float | None) -> dict[str, Any]:
        return {
            "tool_call_id": self.pending.tool_call_id,
            "tool": self.pending.tool,
            "arguments": self.pending.arguments,
            "preview": self.pending.preview,
            "expires_at": iso(expires_at),
            "decided": self.decided,
            **self.deciders_json(),
        }

    def deciders_json(self) -> dict[str, Any]:
        """Who decides it so far (reference §19)."""
        return {
            "quorum": self.pending.quorum,
            "approvals": [dict(a) for a in self.approvals],
            "suspended_at": iso(self.suspended_at),
            "escalated_at": iso(self.escalated_at),
        }


@dataclass(frozen=True, kw_only=True)
class Run:
    """A run as stored (without its messages). Times are epoch seconds of the DB clock."""

    id: str
    user_id: str
    question: str
    route: dict[str, Any]
    state: RunState
    step: int
    limits: Limits
    budget: Budget
    scope_snapshot: dict[str, Any]
    scope_resolved_at: float
    pending: Pending | None
    # SHA-256 of the token of the current (or last) suspension; never the token itself.
    pending_token_hash: str | None
    suspended_at: float | None
    expires_at: float | None
    halt_reason: str | None
    fail_reason: str | None
    recovery_attempts: int
    # Consecutive failed model calls (reference §10); a stored turn resets it.
    model_failures: int
    owner: str | None
    lease_epoch: int
    heartbeat_at: float | None
    versions: dict[str, Any]
    message_count: int
    started_at: float
    updated_at: float
    # The validated typed output of an answered run, as JSON (reference §11), or None.
    output: Any = None
    # The final answer's text once the run is answered (reference §6), when the read that
    # made this record loaded it (a run's reads and lists do); None before.
    answer: str | None = None
    # The W3C trace context every span of the run is parented on (``tracing.py``), or None.
    trace_context: dict[str, str] | None = None
    # The agent version the run is written for (reference §12): only its servers carry it.
    agent_version: str = ""
    # A fork's lineage, ``{"run_id", "step"}``, or None; a dry run never executes a write.
    forked_from: dict[str, Any] | None = None
    dry_run: bool = False
    # Its conversation and place there, from 1 (reference §14); how many of its stored
    # messages copy an earlier conversation (a fork of a follow-up).
    thread_id: str = ""
    thread_pos: int = 1
    base_count: int = 0
    # How many calls of the current suspension have no decision yet (reference §15).
    undecided: int = 0
    # Flow control (reference §13): the claim order (higher first), when a ``queued`` run
    # may start (epoch seconds; None: at once), the schedule whose tick created it.
    priority: int = 0
    start_at: float | None = None
    schedule_id: str | None = None
    # The calls of the current suspension in call order, when the read that made this
    # record loaded them (a suspended run's ``get_run``); empty otherwise.
    pending_calls: tuple[PendingCall, ...] = ()
    # Its place in a tree of sub-agents (reference §18): the run and call that started it
    # (None for a top-level run), the tree's root (its own id for a top-level run), how
    # deep it is (0 at the root), and, when a budget halted it, whose limits did.
    parent_run_id: str | None = None
    parent_tool_call_id: str | None = None
    root_run_id: str = ""
    depth: int = 0
    halted_by: str | None = None

    def __post_init__(self) -> None:
        if not self.root_run_id:  # a top-level run is its own tree's root
            object.__setattr__(self, "root_run_id", self.id)

    @property
    def is_child(self) -> bool:
        """Whether a sub-agent call of another run started it (reference §18)."""
        return self.parent_run_id is not None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Run:
        pending = row["pending"]
        return cls(
            id=row["id"],
            user_id=row["user_id"],
            question=row["question"],
            route=dict(row["route"] or {}),
            state=RunState(row["state"]),
            step=row["step"],
            limits=Limits(
                max_steps=row["max_steps"],
                max_spend_usd=row["max_spend_usd"],
                max_tool_calls=row["max_tool_calls"],
                max_elapsed_ms=row["max_elapsed_ms"],
            ),
            budget=Budget(
                steps=row["steps"],
                spend_usd=row["spend_usd"],
                tool_calls=row["tool_calls"],
                elapsed_ms=row["elapsed_ms"],
            ),
            scope_snapshot=dict(row["scope_snapshot"] or {}),
            scope_resolved_at=row["scope_resolved_at"],
            pending=Pending.from_json(pending) if pending else None,
            pending_token_hash=row["pending_token_hash"],
            suspended_at=row["suspended_at"],
            expires_at=row["expires_at"],
            halt_reason=row["halt_reason"],
            fail_reason=row["fail_reason"],
            recovery_attempts=row["recovery_attempts"],
            model_failures=row["model_failures"],
            owner=row["owner"],
            lease_epoch=row["lease_epoch"],
            heartbeat_at=row["heartbeat_at"],
            versions=dict(row["versions"] or {}),
            message_count=row["message_count"],
            started_at=row["started_at"],
            updated_at=row["updated_at"],
            output=row["output"],
            answer=answer_of(row.get("final_message")),
            trace_context=row["trace_context"],
            agent_version=row["agent_version"],
            forked_from=_lineage(row["forked_from_run"], row["forked_from_step"]),
            dry_run=bool(row["dry_run"]),
            thread_id=row["thread_id"] or row["id"],
            thread_pos=row["thread_pos"],
            base_count=row["base_count"],
            undecided=row["undecided"],
            priority=row["priority"],
            start_at=row["start_at"],
            schedule_id=row["schedule_id"],
            parent_run_id=row["parent_run_id"],
            parent_tool_call_id=row["parent_tool_call_id"],
            root_run_id=row["root_run_id"] or "",
            depth=row["depth"],
            halted_by=row["halted_by"],
        )

    def suspension_calls(self) -> tuple[PendingCall, ...]:
        """The calls its suspension waits on, in call order (reference §15): the loaded
        ``pending_calls``, or its one ``pending`` call when the read loaded none."""
        if self.pending_calls or self.pending is None:
            return self.pending_calls
        only = PendingCall(
            pending=self.pending,
            token_hash=self.pending_token_hash or "",
            position=0,
            epoch=self.lease_epoch,
        )
        return (only,)

    def undecided_calls(self) -> tuple[Pending, ...]:
        """The calls of its suspension that wait for a decision, in call order."""
        return tuple(c.pending for c in self.suspension_calls() if c.decided is None)

    def lease(self) -> Lease:
        """The lease this record shows; only meaningful right after a claim."""
        if self.owner is None:
            raise ValueError("run has no owner")
        return Lease(run_id=self.id, owner=self.owner, epoch=self.lease_epoch)


def answer_of(message: Any) -> str | None:
    """The text of a final answer's message (its ``content``), or None without one."""
    content = message.get("content") if isinstance(message, Mapping) else None
    return content if isinstance(content, str) else None


def _lineage(run_id: str | None, step: int | None) -> dict[str, Any] | None:
    return None if run_id is None else {"run_id": run_id, "step": step}


def iso(epoch: float | None) -> str | None:
    """Epoch seconds of the database clock as ISO-8601 UTC."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def child_to_json(child: Run) -> dict[str, Any]:
    """A child as its parent's JSON lists it (reference §18)."""
    return {
        "id": child.id,
        "agent": child.route.get("agent"),
        "tool_call_id": child.parent_tool_call_id,
        "state": child.state.value,
    }


def run_to_json(
    run: Run,
    *,
    children: Sequence[Run] | None = None,
    consumed_tree: Budget | None = None,
) -> dict[str, Any]:
    """A run as reference §6 shapes it, without its messages. A run's own JSON (not a
    list's) names its ``children`` in call order and, with them, its ``consumed_tree``
    (reference §18)."""
    pending = None
    if run.pending is not None and run.state is RunState.SUSPENDED:
        pending = {
            "tool_call_id": run.pending.tool_call_id,
            "tool": run.pending.tool,
            "arguments": run.pending.arguments,
            "preview": run.pending.preview,
            "expires_at": iso(run.expires_at),
        }
    budget: dict[str, Any] = {"limits": run.limits.to_json(), "consumed": run.budget.to_json()}
    family: dict[str, Any] = {}
    if children is not None:
        budget["consumed_tree"] = consumed_tree.to_json() if consumed_tree and children else None
        family["children"] = [child_to_json(c) for c in children]
    return {
        "id": run.id,
        "user_id": run.user_id,
        "question": run.question,
        "state": run.state.value,
        "step": run.step,
        "halt_reason": run.halt_reason,
        "fail_reason": run.fail_reason,
        "budget": budget,
        "pending": pending,
        "pending_calls": (
            [c.to_json(run.expires_at) for c in run.pending_calls]
            if run.state is RunState.SUSPENDED
            else []
        ),
        "output": run.output,
        "answer": run.answer if run.state is RunState.ANSWERED else None,
        "agent_version": run.agent_version,
        "forked_from": run.forked_from,
        "dry_run": run.dry_run,
        "thread_id": run.thread_id,
        "priority": run.priority,
        "start_at": iso(run.start_at) if run.start_at is not None else None,
        "schedule_id": run.schedule_id,
        "parent_run_id": run.parent_run_id,
        "parent_tool_call_id": run.parent_tool_call_id,
        "root_run_id": run.root_run_id,
        "depth": run.depth,
        "halted_by": run.halted_by,
        **family,
        "created_at": iso(run.started_at),
        # State changes set updated_at; a running run's progress shows in its heartbeat.
        "updated_at": iso(max(run.updated_at, run.heartbeat_at or 0.0)),
    }


def request_to_json(run: Run, call: PendingCall, base_url: str = "") -> dict[str, Any]:
    """A pending call of a suspended run as ``GET /v1/approvals`` lists it (reference §6,
    one request per undecided call of the turn, §15), from the stored tool call and its
    preview, with who decides it so far (§19) and where to decide it by run and call id
    (``base_url``: the public URL those paths start with)."""
    pending = call.pending
    return {
        "run_id": run.id,
        "user_id": run.user_id,
        "question": run.question,
        "tool": pending.tool,
        "tool_call_id": pending.tool_call_id,
        "arguments": pending.arguments,
        "preview": pending.preview,
        "digest": pending.digest,
        "expires_at": iso(run.expires_at),
        "pending_calls": len(run.suspension_calls()),
        "root_run_id": run.root_run_id,
        "parent_run_id": run.parent_run_id,
        "decide_url": f"{base_url}/v1/runs/{run.id}/decisions",
        **call.deciders_json(),
    }
