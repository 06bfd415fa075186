"""What the Engine returns: where a run stopped (never raised), a run as a caller reads it,
the outcome and preview of a decision, the inbox, live events and a reaper pass."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from tether.budget import Budget
from tether.errors import TetherError
from tether.models.base import Message
from tether.notify import Notice
from tether.runs import Pending, Run, RunState, iso, run_to_json
from tether.store import Decision, Event
from tether.store.threads import ThreadRecord
from tether.trees import TreeView as TreeView  # a record the Engine returns, kept apart


class StopKind(str, enum.Enum):
    """Why the loop returned."""

    ANSWERED = "answered"
    SUSPENDED = "suspended"
    HALTED = "halted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RELEASED = "released"  # handed back to the workers, still running
    LEASE_LOST = "lease_lost"  # another owner took the run; this one wrote nothing more
    # The database could not be reached: this process let go of the run without writing
    # more, and it is recovered as an orphan (or its write retried) once the database is back.
    ABANDONED = "abandoned"
    # A follow-up still waiting for the earlier runs of its thread (reference §14).
    QUEUED = "queued"
    # It waits for the child runs its turn started (reference §18).
    WAITING = "waiting"

    @property
    def state(self) -> RunState | None:
        """The run's state after this stop; None when this process cannot tell (lost)."""
        return _STATE_OF.get(self)

    @classmethod
    def of(cls, state: RunState) -> StopKind:
        """The stop a stored state shows (a running run is waiting for a worker)."""
        return _KIND_OF[state]


# The one map between stops and states, both ways.
_STATE_OF = {
    StopKind.ANSWERED: RunState.ANSWERED,
    StopKind.SUSPENDED: RunState.SUSPENDED,
    StopKind.HALTED: RunState.HALTED,
    StopKind.FAILED: RunState.FAILED,
    StopKind.CANCELLED: RunState.CANCELLED,
    StopKind.RELEASED: RunState.RUNNING,
    StopKind.QUEUED: RunState.QUEUED,
    StopKind.WAITING: RunState.WAITING,
}
_KIND_OF = {state: kind for kind, state in _STATE_OF.items()}


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Where a run stopped: the kind, the halt or fail reason, the suspension's notice,
    the model's final answer when it answered, and, for a run handed back with a delay (a
    backoff), in how many seconds it may be claimed again."""

    run_id: str
    kind: StopKind
    reason: str | None = None
    # A suspension's notice of its first call, and every notice it sent (one per call).
    notice: Notice | None = None
    notices: tuple[Notice, ...] | list[Notice] = ()
    answer: str | None = None
    retry_in_s: float | None = None
    # The answer validated against the agent's ``output_type``: an instance of it (narrow
    # with ``isinstance``); None without one, or when this call did not carry the run to
    # its answer (``RunView.output`` holds the stored JSON of any answered run; reference §11).
    output: BaseModel | None = None

    @property
    def state(self) -> RunState | None:
        return self.kind.state


@dataclass(frozen=True, kw_only=True)
class ApprovalResult:
    """A decision that took effect: what was decided, and where the run is now."""

    run_id: str
    decision: Choice
    state: RunState
    outcome: CallVerdict
    ok: bool = True
    # A decision recorded while other calls of its suspension are undecided (reference
    # §15): how many of them it still waits for.
    waiting_for: int | None = None
    # The other calls of the turn this decision's request carried out (a claim carries
    # the turn out), in call order, each answered as it was carried out (reference §15).
    carried: tuple[CallDecision, ...] = ()
    # An approval of a call that waits on a quorum, before the N-th (reference §19): how
    # many approvals of its artefact there are now, and how many it waits for.
    approvals: int | None = None
    quorum: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ok": self.ok,
            "run_id": self.run_id,
            "decision": self.decision.value,
            "state": self.state.value,
            "outcome": self.outcome.value,
        }
        if self.waiting_for is not None:
            data["waiting_for"] = self.waiting_for
        if self.approvals is not None:
            data["approvals"] = self.approvals
            data["quorum"] = self.quorum
        if self.carried:
            data["carried"] = [call.to_json() for call in self.carried]
        return data


@dataclass(frozen=True, kw_only=True)
class CallDecision:
    """What became of one call's decision taken by run and tool call id: the decision that
    took effect (``result``), or the refusal its token would have met (``refused``)."""

    tool_call_id: str
    result: ApprovalResult | None = None
    refused: TetherError | None = None

    def to_json(self) -> dict[str, Any]:
        """The call's answer as its token's endpoint gives it, with the call's id; a
        refusal's ``outcome`` is its error code."""
        if self.result is not None:
            return {"tool_call_id": self.tool_call_id, **self.result.to_json()}
        assert self.refused is not None
        refusal = self.refused.to_dict()
        return {"tool_call_id": self.tool_call_id, "outcome": refusal["error"], **refusal}


@dataclass(frozen=True, kw_only=True)
class ApprovalPreview:
    """The preview a pending call would have with ``arguments`` (validated), and its
    digest: what an approver sees before approving an edit. Nothing was claimed."""

    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    digest: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "tool": self.tool,
            "arguments": self.arguments,
            "preview": self.preview,
            "digest": self.digest,
        }


class Choice(str, enum.Enum):
    """What a human decided on a pending call; the stored string."""

    APPROVE = "approve"
    DECLINE = "decline"


# The stored decision of an approval of an edit sent without the digest of the edit's
# preview: not an approval (the approver has not seen that preview), so nothing runs; the
# run waits again on the edit (``changed``), and its event is ``edited`` (reference §9).
UNSEEN_EDIT = "edit"


class CallVerdict(str, enum.Enum):
    """What became of a decided call."""

    EXECUTED = "executed"
    DECLINED = "declined"
    # Recorded while other calls of its suspension are undecided: nothing executed yet.
    RECORDED = "recorded"
    # The run's budget ran out before the call could run (a call before it in its turn
    # spent the last of it): the run halted, its owner may continue it.
    HALTED = "halted"
    GUARD_FAILED = "guard_failed"
    NO_LONGER_PERMITTED = "no_longer_permitted"
    CHANGED = "changed"
    REFUSED = "refused"  # its arguments no longer validate
    # The tool is not in the serving agent version: the run halted ``tool_unavailable``.
    TOOL_UNAVAILABLE = "tool_unavailable"
    RELEASED = "released"  # nothing was pending to decide; the run went back to the workers
    # The write was attempted and whether it took effect cannot be learnt: the run failed
    # ``unreconcilable`` and waits for a person (its ledger says ``unknown``).
    UNRECONCILABLE = "unreconcilable"
    # The decision is recorded with the run, but this request lost the run to another
    # owner (it was taken for dead) before finishing: that owner carries the decision out.
    CONTINUES_ELSEWHERE = "continues_elsewhere"
    # The approved write's answer was lost and its lookup by key could not reach the
    # downstream in time: the decision is recorded, and the reapers reconcile the call.
    RECONCILING = "reconciling"


@dataclass(frozen=True, kw_only=True)
class Inbox:
    """A page of the pending requests a viewer may decide (soonest expiry first), the
    database clock they were judged by, and how many more follow it (``more``: ask again
    with ``after``). It reads like the list of its runs: iterable and sized."""

    runs: list[Run]
    now: float
    more: int = 0

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def after(self) -> str | None:
        """The cursor of the next page (its last request's expiry and id); None at the
        end."""
        if not self.more or not self.runs or self.runs[-1].expires_at is None:
            return None
        return f"{self.runs[-1].expires_at!r}:{self.runs[-1].id}"


@dataclass(frozen=True, kw_only=True)
class RunPage:
    """One page of runs, newest first, and how many more runs follow it. It reads like
    the list of its runs: iterable and sized."""

    runs: list[Run]
    more: int

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def after(self) -> str | None:
        """The cursor of the next page (the id of this page's last run); None at the end."""
        return self.runs[-1].id if self.more and self.runs else None


@dataclass(frozen=True, kw_only=True)
class TokenLookup:
    """What an approval token names: the run suspended on it, or the decision that used it
    (with that decision's run), judged at the database's ``now``."""

    run: Run | None
    used: Decision | None
    decided_run: Run | None
    now: float
    # The run whose suspension on the token expired, shown to its owner only.
    expired: Run | None = None
    # The call of ``run``'s suspension the token names (reference §15: each call of a
    # turn has its own token), while ``run`` is shown.
    call: Pending | None = None


@dataclass(frozen=True, kw_only=True)
class LiveEvent:
    """One stored event of a run as every caller gets it (``Engine.events``,
    ``Engine.watch``, the HTTP API): its SEQ is its ordinal in the run, from 1 (reference
    §11); its ``id`` orders events across runs."""

    id: int
    seq: int
    run_id: str
    at: float
    kind: str
    data: dict[str, Any]

    @classmethod
    def of(cls, event: Event, seq: int) -> LiveEvent:
        """The stored ``event``, the ``seq``-th of its run."""
        return cls(
            id=event.id, seq=seq, run_id=event.run_id, at=event.at, kind=event.kind, data=event.data
        )

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": iso(self.at), "kind": self.kind, "data": self.data}


@dataclass(frozen=True, kw_only=True)
class Delta:
    """A piece of the assistant text of the step being generated (reference §16): not a
    stored event, so it has no SEQ. ``offset`` counts code points of the step's text; a
    delta at 0 replaces what a watcher holds of that step (a catch-up, or a step whose
    model call started again). ``catch_up`` marks the text so far, sent to a watcher that
    (re)connected or fell behind (then ``dropped``: deltas it was too slow to read were
    dropped, and this one holds them)."""

    run_id: str
    step: int
    offset: int
    text: str
    catch_up: bool = False
    dropped: bool = False

    kind = "delta"

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "offset": self.offset, "text": self.text}


@dataclass(frozen=True, kw_only=True)
class RunView:
    """A run with its messages, as a caller reads it; a parent also with its children in
    call order and its ``consumed_tree`` (its own consumption plus all its descendants',
    None for a run without children; reference §18)."""

    run: Run
    messages: list[Message]
    children: list[Run] = field(default_factory=list)
    consumed_tree: Budget | None = None

    @property
    def output(self) -> Any:
        """The validated typed output as stored (JSON), or None (reference §11)."""
        return self.run.output

    @property
    def answer(self) -> str | None:
        """The final answer's text once the run is answered, else None (reference §6)."""
        return self.run.answer

    def to_json(self, *, messages: bool = True) -> dict[str, Any]:
        """The run's own JSON (reference §6, §18), with its ``messages`` unless told not."""
        data = run_to_json(self.run, children=self.children, consumed_tree=self.consumed_tree)
        if messages:
            data["messages"] = self.messages
        return data


@dataclass(frozen=True, kw_only=True)
class Accepted:
    """A creation request's answer (reference §14): the run it created, as it is now, and
    the answer first given for it, ``status`` and ``body`` (the ``{"id", "state"}`` of the
    creation). A repeat of an ``Idempotency-Key`` gets the first request's answer again."""

    run: Run
    status: int
    body: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ThreadView:
    """A thread as a caller reads it (reference §14): its runs in order, what they
    consumed together, and (read one at a time) its whole conversation."""

    id: str
    user_id: str
    created_at: float
    updated_at: float
    runs: list[Run]
    messages: list[Message] | None = None

    @classmethod
    def of(cls, record: ThreadRecord) -> ThreadView:
        return cls(
            id=record.id,
            user_id=record.user_id,
            created_at=record.created_at,
            updated_at=record.updated_at,
            runs=record.runs,
            messages=record.messages,
        )

    @property
    def consumed(self) -> Budget:
        """The budget its runs consumed, summed."""
        total = Budget()
        for run in self.runs:
            total = total.plus(run.budget)
        return total

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "user_id": self.user_id,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "runs": [
                {
                    "id": r.id,
                    "state": r.state.value,
                    "question": r.question,
                    "created_at": iso(r.started_at),
                }
                for r in self.runs
            ],
            "consumed": self.consumed.to_json(),
        }
        if self.messages is not None:
            data["messages"] = self.messages
        return data


@dataclass(frozen=True, kw_only=True)
class ReapReport:
    """One reaper pass: what was recovered, stopped, expired, re-notified and purged."""

    recovered: list[str]
    stopped: dict[str, str]
    expired: list[str]
    notices_reissued: list[str]
    purged: int
    # The runs whose calls this pass escalated (reference §19).
    escalated: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "recovered": self.recovered,
            "stopped": self.stopped,
            "expired": self.expired,
            "escalated": self.escalated,
            "notices_reissued": self.notices_reissued,
            "purged": self.purged,
        }
