"""The JSON shapes of the HTTP API (reference §6); the HTTP status of each error code is in
``statuses.py``."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from tether.budget import LimitsInput
from tether.inputs import DIGEST, MAX_QUESTION_CHARS, MAX_REASON_CHARS
from tether.runs import RunState

# -- input ---------------------------------------------------------------------------------


def _text(value: str) -> str:
    """Text the store can keep on both backends: no NUL, no lone surrogates."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode text") from exc
    return value


def _question(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return _text(value)


# A question for the agent: what a run, or each tick of a schedule, asks.
Question = Annotated[
    str, Field(min_length=1, max_length=MAX_QUESTION_CHARS), AfterValidator(_question)
]


class StartRunIn(BaseModel):
    """A question for the agent, with optional limits over the configured defaults."""

    model_config = ConfigDict(extra="forbid")

    question: Question
    limits: LimitsInput | None = None
    thread_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="one of the caller's threads: the run is a follow-up in it (§14); "
        "absent: the run starts a new thread",
    )
    if_busy: Literal["reject", "enqueue"] = Field(
        default="reject",
        description="a follow-up to a busy thread: `reject` (409 `thread_busy`) or "
        "`enqueue` (accepted `queued`, started when the runs before it stop)",
    )
    priority: Annotated[StrictInt, Field(ge=-10, le=10)] | None = Field(
        default=None,
        description="-10 to 10 (null or absent: 0): workers claim higher priorities first, "
        "then the runs that waited longest (§13)",
    )
    start_at: str | None = Field(
        default=None,
        max_length=64,
        description="ISO-8601 with a UTC offset: the run is `queued` until then, by the "
        "database's clock; a past time starts it at once",
    )


Decision = Literal["approve", "decline"]
DECISIONS: tuple[str, ...] = get_args(Decision)


class DecisionIn(BaseModel):
    """A human decision on a pending request (reference §9): a reason (either decision), and
    with an approval the edited arguments and the digest of the preview the approver saw."""

    model_config = ConfigDict(extra="forbid")

    decision: Decision
    reason: Annotated[str, AfterValidator(_text)] | None = Field(
        None, max_length=MAX_REASON_CHARS, description="why; reaches the model on a decline"
    )
    arguments: dict[str, Any] | None = Field(
        None, description="the approver's edit of the pending call's arguments (approve only)"
    )
    digest: str | None = Field(
        None,
        pattern=DIGEST.pattern,
        description="the digest of the preview the approver saw (from the preview endpoint)",
    )


class CallDecisionIn(DecisionIn):
    """A decision on one pending call of a run, named by its tool call id (reference §15)."""

    tool_call_id: str = Field(min_length=1, max_length=128, description="the pending call's id")


class DecisionsIn(BaseModel):
    """Decisions on pending calls of one run, all checked before any is recorded."""

    model_config = ConfigDict(extra="forbid")

    decisions: list[CallDecisionIn] = Field(min_length=1, max_length=100)


class PreviewIn(BaseModel):
    """Arguments to render the pending call's preview with (absent: as pending)."""

    model_config = ConfigDict(extra="forbid")

    arguments: dict[str, Any] | None = None


class ContinueIn(BaseModel):
    """An explicit grant for a halted run: limits (default: reference §6's grant) and why."""

    model_config = ConfigDict(extra="forbid")

    limits: LimitsInput | None = None
    why: Annotated[str, Field(max_length=2000), AfterValidator(_text)] | None = None


class ForkIn(BaseModel):
    """Where to fork a run (reference §12): through step ``at_step``, as a dry run or not."""

    model_config = ConfigDict(extra="forbid")

    at_step: int = Field(
        strict=True, ge=1, le=1_000_000, description="the step (model turn, from 1) to fork after"
    )
    dry_run: bool = Field(
        default=False, strict=True, description="the fork never executes a write (reference §12)"
    )


# -- output --------------------------------------------------------------------------------


class LimitsOut(BaseModel):
    max_steps: int
    max_spend_usd: float
    max_tool_calls: int
    max_elapsed_ms: int


class ConsumedOut(BaseModel):
    steps: int
    spend_usd: float
    tool_calls: int
    elapsed_ms: int


class BudgetOut(BaseModel):
    limits: LimitsOut
    consumed: ConsumedOut


class TreeBudgetOut(BudgetOut):
    consumed_tree: ConsumedOut | None = Field(
        default=None, description="its own and all its descendants' (§18); null without children"
    )


class PendingOut(BaseModel):
    """The request a suspended run waits on, from the stored tool call."""

    tool_call_id: str = Field(description="the call's id: decide it by run and call id")
    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    expires_at: str | None = Field(description="ISO-8601, UTC")


class DecidedOut(BaseModel):
    decision: str
    by: str
    at: str | None


class ApprovedByOut(BaseModel):
    """One approval of a call's current artefact, toward its quorum (§19)."""

    by: str
    at: str | None = Field(description="ISO-8601, UTC")


# Who decides a pending call so far (§19), wherever the call is shown.
Quorum = Annotated[
    int, Field(description="how many distinct people approve it (1: one person decides)")
]
Approvals = Annotated[
    list[ApprovedByOut],
    Field(description="the approvals of its current artefact so far, oldest first"),
]
SuspendedAt = Annotated[str | None, Field(description="when it was suspended, ISO-8601, UTC")]
EscalatedAt = Annotated[
    str | None, Field(description="when it was escalated, ISO-8601, UTC; null: not escalated")
]


class PendingCallOut(PendingOut):
    """One call of a turn's suspension (§15), in call order, with its decision once one is
    recorded and who decides it so far (§19)."""

    decided: DecidedOut | None = Field(description="null while undecided")
    quorum: Quorum
    approvals: Approvals
    suspended_at: SuspendedAt
    escalated_at: EscalatedAt


class ForkedFromOut(BaseModel):
    run_id: str
    step: int


class ChildOut(BaseModel):
    """A child run, as its parent's JSON lists it (§18)."""

    id: str
    agent: str | None = Field(description="the sub-agent's name")
    tool_call_id: str | None = Field(description="the parent's call that started it")
    state: RunState


class RunSummaryOut(BaseModel):
    """A run as a list shows it: without its messages, its children or its tree's
    consumption."""

    id: str
    user_id: str
    question: str
    state: RunState
    step: int
    halt_reason: str | None
    fail_reason: str | None
    budget: BudgetOut
    pending: PendingOut | None = Field(description="set while the run is suspended")
    pending_calls: list[PendingCallOut] = Field(
        default_factory=list,
        description="every call the suspension waits on, in call order (§15); [] otherwise",
    )
    output: Any = Field(
        default=None,
        description="the final answer validated against the agent's output_type, as JSON; "
        "null without an output_type or until the run answered",
    )
    answer: str | None = Field(description="the final answer's text once answered, else null")
    agent_version: str = Field(description="the agent version the run is written for (§12)")
    forked_from: ForkedFromOut | None = Field(
        default=None, description="the run and step this run was forked from, or null"
    )
    dry_run: bool = Field(default=False, description="a dry run never executes a write")
    thread_id: str = Field(description="the thread (conversation) the run belongs to (§14)")
    priority: int = Field(default=0, description="claimed before lower priorities (§13)")
    start_at: str | None = Field(default=None, description="ISO-8601, UTC; queued till then")
    schedule_id: str | None = Field(default=None, description="the schedule that made it")
    parent_run_id: str | None = Field(
        default=None, description="the run whose sub-agent call started it (§18); null at the top"
    )
    parent_tool_call_id: str | None = Field(
        default=None, description="that call's id; null for a top-level run"
    )
    root_run_id: str = Field(description="its tree's top-level run (its own id at the top)")
    depth: int = Field(default=0, description="0 for a top-level run, 1 for its children, ...")
    halted_by: str | None = Field(
        default=None, description="the run whose limits halted it (maybe its own id), else null"
    )
    created_at: str = Field(description="ISO-8601, UTC")
    updated_at: str = Field(description="ISO-8601, UTC")


class RunOut(RunSummaryOut):
    """A run without its messages: with its children, in call order, and its tree's
    consumption (§18)."""

    budget: TreeBudgetOut
    children: list[ChildOut] = Field(
        default_factory=list, description="the runs its sub-agent calls started, in call order"
    )


class RunDetailOut(RunOut):
    """A run with its messages (OpenAI chat format), the state the model sees."""

    messages: list[dict[str, Any]]


class RunListOut(BaseModel):
    """A page of the caller's top-level runs (§18), newest first."""

    items: list[RunSummaryOut]
    more: int = Field(description="how many more runs follow this page")
    after: str | None = Field(description="the next page's cursor (its last run), or null")
    next: str | None = Field(description="the next page's path, or null on the last")


class AcceptedOut(BaseModel):
    id: str
    state: RunState


class ThreadRunOut(BaseModel):
    id: str
    state: RunState
    question: str
    created_at: str = Field(description="ISO-8601, UTC")


class ThreadOut(BaseModel):
    """A conversation (§14): its runs in order and what they consumed together."""

    id: str
    user_id: str
    created_at: str = Field(description="ISO-8601, UTC")
    updated_at: str = Field(description="its last activity, ISO-8601, UTC")
    runs: list[ThreadRunOut]
    consumed: dict[str, Any] = Field(description="steps, spend_usd, tool_calls, elapsed_ms")


class ThreadDetailOut(ThreadOut):
    messages: list[dict[str, Any]] = Field(
        description="the whole conversation, as the model is handed it (OpenAI chat format)"
    )


class ThreadListOut(BaseModel):
    items: list[ThreadOut]


class EventOut(BaseModel):
    id: int
    seq: int = Field(description="the event's ordinal in its run, from 1 (reference §11)")
    at: str = Field(description="ISO-8601, UTC")
    kind: str
    data: dict[str, Any]


class EventListOut(BaseModel):
    items: list[EventOut]


class ErasedCountsOut(BaseModel):
    runs: int = Field(description="the caller's runs deleted (children of trees included)")
    threads: int = Field(description="the caller's conversations deleted")
    schedules: int = Field(description="the caller's schedules deleted")


class ErasedOut(BaseModel):
    """What erasing the caller's data deleted (reference §20)."""

    erased: ErasedCountsOut


class ErrorOut(BaseModel):
    """Every refusal: a stable code and a message for people; some codes add fields."""

    model_config = ConfigDict(extra="allow")

    ok: Literal[False]
    error: str
    message: str
