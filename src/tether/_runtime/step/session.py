"""A run session: the lease, messages and budget of one claimed run.

The session holds the run's state and nothing else: each durable write is one method and
one thread hop, fenced by the lease (invariant 8), and it keeps the in-memory messages
and budget equal to what it wrote. What to write, and when, is decided by the loop
(``loop.py``), the calls (``tool_call.py``) and the resumptions (``decided_call.py``,
``recovery.py``, ``tether.approvals``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step.first_messages import open_follow_up
from tether._runtime.step.writes import Result, Turn, error_content, intent, turn_of
from tether.budget import Budget, TreeBudget
from tether.errors import DatabaseUnavailable, LeaseLost, TetherError
from tether.failpoints import fail
from tether.messages import (
    ToolCall,
    pending_tool_calls,
    tool_call_ids,
    tool_result,
)
from tether.models.base import Message, ModelResponse
from tether.output import Verdict
from tether.reasons import FailReason, HaltReason
from tether.results import Outcome, StopKind
from tether.runs import Lease, Pending, Run, RunState
from tether.scope import Scope
from tether.store import (
    CallStatus,
    CompactionRecord,
    Decision,
    StepRefused,
    idempotency_key,
)
from tether.telemetry import content, tracing
from tether.tokens import hash_token, new_token
from tether.tools.tool import ToolContext

log = logging.getLogger(__name__)


class RunSession:
    """One claimed run: its lease, messages, budget and scope, and its durable writes."""

    def __init__(
        self,
        services: Services,
        run: Run,
        messages: list[Message],
        scope: Scope,
        *,
        decisions: dict[str, Decision] | None = None,
        asked: dict[str, Pending] | None = None,
        recovering: bool = False,
        stopping: asyncio.Event | None = None,
        history: Sequence[Message] = (),
        compaction: CompactionRecord | None = None,
        input_tokens: int = 0,
    ) -> None:
        self.services = services
        self.run = run
        self.lease: Lease = run.lease()
        # The run's own stored messages (what its writes append to), and the conversation
        # before it in its thread (reference §14), read once and never written.
        self.messages = messages
        self.history: list[Message] = list(history)
        # The compaction the model sees the conversation through, and what the latest
        # model call reported (reference §14, ``compaction.py``), as stored.
        self.compaction = compaction
        self.input_tokens = input_tokens
        self.budget: Budget = run.budget
        # The model turns its messages hold (the run's ``step``): a fork starts at the step
        # it was forked at, so its turns go on from there while its budget starts at zero.
        self.step = run.step
        self.scope = scope
        # The decisions recorded on calls of the run's suspensions that have no result
        # yet, by tool call id, each until it is carried out.
        unanswered = {c.id for c in pending_tool_calls(messages)}
        self._decisions = {k: d for k, d in (decisions or {}).items() if k in unanswered}
        # What the run's suspensions asked of each call (its preview, an edit's origin).
        self._asked = dict(asked or {})
        # Only a run taken over from a dead owner may have a call whose effect happened
        # without its result being stored, and only in its first group of unanswered calls
        # (a write alone, or the calls that ran together, ``parallel.py``): calls after a
        # group start once it has its results, so everything later is known not to have run.
        self._recovering = recovering
        # Set when this process is shutting down: the run is handed back at the next step
        # boundary so another worker takes it at once.
        self._stopping = stopping
        # Call ids are kept unique in the whole conversation the model sees.
        self._call_ids = tool_call_ids(itertools.chain(self.history, messages))
        self._mark = time.monotonic()
        parent = bool(services.agent.subagents)  # its runs may have children (§18)
        self.trees = TreeBudget.of(run.limits, run.route, child=run.is_child, parent=parent)
        # The engine's heartbeat keeps the lease alive until ``close``.
        self._held = services.heartbeat.hold(self.lease)

    @classmethod
    async def start(
        cls,
        services: Services,
        run: Run,
        *,
        recovering: bool = False,
        stopping: asyncio.Event | None = None,
    ) -> RunSession:
        """A session for a run this process just claimed: loads it, re-resolves the user's
        scope now (invariant 7) and stores the fresh snapshot of it if it changed. A
        child run is carried with its sub-agent (``Services.serving``)."""
        services = services.serving(run)
        compacts = services.agent.compaction is not None  # else no compaction is ever stored
        snapshot = await hop(services.store.snapshot, run.id, history=True, compacts=compacts)
        if snapshot is None:
            raise LeaseLost("run vanished after its claim", run_id=run.id)
        held = snapshot.run
        if (held.state, held.owner, held.lease_epoch) != (
            RunState.RUNNING,
            run.owner,
            run.lease_epoch,
        ):
            raise LeaseLost("the run was taken over after its claim", run_id=run.id)
        scope = await services.agent.resolve_scope(run.user_id)
        if scope.to_json() != snapshot.run.scope_snapshot:
            # Stored when it changed (a write less per start when it did not): the run's
            # next write is fenced all the same, and the snapshot is what people read.
            await hop(services.store.refresh_scope, run.lease(), scope.to_json())
        messages = snapshot.messages
        if run.thread_pos > 1 and not messages:
            messages = await open_follow_up(services, run, snapshot.history)
        return cls(
            services,
            run,
            messages,
            scope,
            decisions=snapshot.decisions,
            asked=snapshot.asked,
            recovering=recovering,
            stopping=stopping,
            history=snapshot.history,
            compaction=snapshot.compaction,
            input_tokens=snapshot.input_tokens,
        )

    # -- what the session knows ------------------------------------------------------------

    def conversation(self) -> list[Message]:
        """The thread's conversation before the run, then the run's own messages."""
        return [*self.history, *self.messages]

    @property
    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def pending_calls(self) -> list[ToolCall]:
        """The last turn's calls that have no result yet, in order."""
        return pending_tool_calls(self.messages)

    def take_decision(self, call_id: str) -> Decision | None:
        """The human decision on ``call_id``, once: once carried out it is never applied again."""
        return self._decisions.pop(call_id, None)

    def asked(self, call_id: str) -> Pending | None:
        """What the run's suspension asked a human of ``call_id``, if it was asked."""
        return self._asked.get(call_id)

    def holds_decisions(self) -> bool:
        """Whether any human decision waits to be carried out."""
        return bool(self._decisions)

    def decided(self, call_id: str) -> bool:
        """Whether a human decision on ``call_id`` waits to be carried out."""
        return call_id in self._decisions

    def take_recovering(self) -> bool:
        """Whether the next call (or group run together) is the first after a takeover (once)."""
        recovering, self._recovering = self._recovering, False
        return recovering

    def ctx(self, call: ToolCall, *, confirmed: bool) -> ToolContext:
        """What the tool learns about ``call``, with the agent's dependencies."""
        return ToolContext(
            run_id=self.run.id,
            user_id=self.run.user_id,
            tool_call_id=call.id,
            idempotency_key=idempotency_key(self.run.id, call.id),
            scope=self.scope,
            confirmed=confirmed,
            deps=self.services.agent.deps,
        )

    # -- durable writes (one transaction each) ---------------------------------------------

    def turn_of(self, response: ModelResponse, *, model: str | None = None) -> Turn:
        """The assistant turn to store for ``response`` (tool call ids made unique in the
        run), with its spend priced for ``model``, the ``TETHER_MODEL`` entry that
        answered (reference §21; default: the engine's model's name); nothing is written."""
        prices, suffix = self.services.settings.prices, self.run.id if self.run.is_child else None
        model = model or self.services.model.name
        taken, step = self._call_ids, self.step + 1
        return turn_of(response, step=step, prices=prices, taken=taken, suffix=suffix, model=model)

    async def append_turn(
        self, turn: Turn, results: Sequence[Result] = (), *, verdict: Verdict | None = None
    ) -> Outcome | None:
        """The assistant turn with its spend, the step count and its calls' ledger intents;
        a turn without calls is the final answer and moves the run to ``answered`` (with
        its ``verdict``'s typed output), unless the verdict rejects it: then the feedback
        to the model is stored after it in the same transaction, and the run goes on. A
        read-only step passes the ``results`` of all its calls, stored in the same
        transaction (their ledger entries then record the outcomes). A tree's step past an
        ancestor's limits is not stored: the run halts, spend counted (reference §18)."""
        by_call = {r.call.id: r for r in results}
        stored = [tool_result(r.call.id, r.content) for r in results]
        counted = sum(1 for r in results if r.counted)
        rejected = verdict is not None and bool(verdict.errors)
        events: list[tuple[str, dict[str, Any]]] = []
        if verdict is not None and rejected:  # the model gets it back with its errors
            stored.append(verdict.feedback())
            events.append(("output_invalid", verdict.event(self.step + 1)))
        try:
            seen = await hop(
                self.services.store.persist_turn,
                self.lease,
                seq=len(self.messages),
                message=turn.message,
                spend_usd=turn.spend,
                elapsed_ms=self.elapsed(),
                intents=[intent(self.services.agent, c, by_call.get(c.id)) for c in turn.calls],
                final=not turn.calls and not rejected,
                event=turn.event,
                results=stored,
                counted=counted,
                result_events=[r.event() for r in results],
                output=None if verdict is None else verdict.stored,
                events=events,
                input_tokens=turn.input_tokens,
                tree_root=self.run.root_run_id if self.trees.tree else None,
                tree_chain=self.trees.chain,
            )
        except StepRefused as refused:
            return await self.halt(
                HaltReason(refused.reason), halted_by=refused.halted_by, spend_usd=turn.spend
            )
        self.trees.seen = seen
        self.input_tokens = turn.input_tokens
        self.messages.append(turn.message)
        self.messages.extend(stored)
        self.budget = self.budget.after_turn(turn.spend).after_tool_calls(counted)
        self.step += 1
        self._recovering = False
        return None

    async def compact(self, summary: str, *, through_seq: int, tokens: int, spend: float) -> None:
        """Store a compaction of the conversation through ``through_seq`` with its spend
        and ``compacted`` event (``store.compact``); the model sees it from the next call."""
        await hop(
            self.services.store.compact,
            self.lease,
            thread_id=self.run.thread_id,
            through_seq=through_seq,
            summary=summary,
            summary_tokens=tokens,
            spend_usd=spend,
            elapsed_ms=self.elapsed(),
            event={"through_seq": through_seq, "summary_tokens": tokens, "spend_usd": spend},
        )
        self.compaction = CompactionRecord(
            run_id=self.run.id, through_seq=through_seq, summary=summary, summary_tokens=tokens
        )
        self.input_tokens = 0
        self.budget = self.budget.after_spend(spend)

    async def append_result(
        self, call: ToolCall, content: Any, status: CallStatus, *, counted: bool
    ) -> None:
        """One tool result with its ledger outcome and counters (a call counted before it
        ran, ``budget_check.prepay``, is not counted again)."""
        if call.id in self.trees.prepaid:
            self.trees.prepaid.discard(call.id)
            counted = False
        result = Result(call=call, content=content, status=status, counted=counted)
        message = tool_result(call.id, content)
        await hop(
            self.services.store.persist_tool_result,
            self.lease,
            seq=len(self.messages),
            tool_call_id=call.id,
            message=message,
            status=status,
            elapsed_ms=self.elapsed(),
            counted=counted,
            event=result.event(),
        )
        self.messages.append(message)
        if counted:
            self.budget = self.budget.after_tool_call()
        tracing.tool_outcome(status.value, counted=counted, code=result.summary, result=content)

    async def refuse(self, call: ToolCall, code: str, message: str) -> None:
        """Store a refusal of ``call`` as its result: it did not run and is not counted."""
        content = error_content(code, message)
        await self.append_result(call, content, CallStatus.ERROR, counted=False)

    async def suspend(self, calls: Sequence[Pending]) -> tuple[list[str], float]:
        """Suspend on ``calls`` (the turn's calls waiting on a human, in call order), each
        with a fresh token (only the tokens' hashes are stored); the calls this session
        holds decisions for keep them. Returns the tokens, in order, and ``expires_at``.
        Sending the notices is the caller's (``suspending.py``)."""
        first = calls[0]
        fail("before_suspend", first.tool)
        tokens = [new_token() for _ in calls]
        expires_at = await hop(
            self.services.store.suspend,
            self.lease,
            calls=[(p, hash_token(t)) for p, t in zip(calls, tokens, strict=True)],
            keep=list(self._decisions),
            ttl_s=self.services.settings.suspension_ttl_s,
            elapsed_ms=self.elapsed(),
            event={
                "tool": first.tool,
                "tool_call_id": first.tool_call_id,
                "digest": first.digest,
                "pending_calls": [
                    {"tool_call_id": p.tool_call_id, "tool": p.tool, "digest": p.digest}
                    for p in calls
                ],
            },
        )
        fail("after_suspend", first.tool)
        log.info("suspended", extra={"run_id": self.run.id, "action": "suspended"})
        return tokens, expires_at

    async def record_edit(self, call: ToolCall, arguments: dict[str, Any]) -> None:
        """Record in the ledger the edited arguments ``call`` is about to run with."""
        await hop(
            self.services.store.record_edit, self.lease, tool_call_id=call.id, arguments=arguments
        )

    async def halt(
        self, reason: HaltReason, *, halted_by: str | None = None, spend_usd: float = 0.0
    ) -> Outcome:
        """running → halted; the run keeps its budget and messages for its owner. A halt
        on a budget names whose limits stopped it (``halted_by``, reference §18)."""
        await hop(
            self.services.store.halt,
            self.lease,
            reason=reason,
            elapsed_ms=self.elapsed(),
            event={"budget": self.budget.to_json(), "limits": self.run.limits.to_json()},
            halted_by=halted_by,
            spend_usd=spend_usd,
        )
        self.budget = self.budget.after_spend(spend_usd)
        log.info("halted", extra={"run_id": self.run.id, "action": "halted", "state": reason})
        return Outcome(run_id=self.run.id, kind=StopKind.HALTED, reason=reason.value)

    async def fail(
        self, reason: FailReason, event: dict[str, Any], *, unknown_call: str | None = None
    ) -> Outcome:
        """running → failed, kept with its ledger for a person to inspect."""
        await hop(
            self.services.store.fail,
            self.lease,
            reason=reason,
            elapsed_ms=self.elapsed(),
            event=event,
            unknown_call=unknown_call,
        )
        return Outcome(run_id=self.run.id, kind=StopKind.FAILED, reason=reason.value)

    async def fail_on_error(self, exc: Exception) -> Outcome:
        """Fail the run on an unexpected error (invariant 6: never ownerless in running)."""
        message = exc.message if isinstance(exc, TetherError) else f"{type(exc).__name__}: {exc}"
        allowed, run_id = self.services.settings.log_content, self.run.id
        log.error("run failed", **content.failure(exc, allowed, run_id=run_id, action="failed"))
        try:
            return await self.fail(FailReason.ERROR, {"error": message[:2000]})
        except LeaseLost:
            return Outcome(run_id=self.run.id, kind=StopKind.LEASE_LOST)
        except DatabaseUnavailable:
            return self.abandon()

    async def hand_over(self, event: dict[str, Any]) -> None:
        """Let go of the run for a reaper to recover (``store.hand_over``); ``close`` first."""
        await hop(self.services.store.hand_over, self.lease, elapsed_ms=self.elapsed(), event=event)

    def abandon(self) -> Outcome:
        """Let go of the run without a write: the database cannot be reached (or a COMMIT
        of ours was cut off). It stays running under this lease, which nobody keeps alive
        any more, so a reaper recovers it (reconciling first) once the database is back."""
        log.warning("run abandoned", extra={"run_id": self.run.id, "action": "abandoned"})
        return Outcome(run_id=self.run.id, kind=StopKind.ABANDONED)

    async def release(self, why: str) -> Outcome:
        """Hand the run back to the workers (still running, no owner)."""
        event = {"why": why}
        await hop(self.services.store.release, self.lease, elapsed_ms=self.elapsed(), event=event)
        return Outcome(run_id=self.run.id, kind=StopKind.RELEASED, reason=why)

    async def retry_model(self, delay_s: float, event: dict[str, Any]) -> tuple[int, float]:
        """Hand the run back after a transient model failure, claimable after ``delay_s``
        (``store.retry_model``); the consecutive failures now counted, and ``ready_at``."""
        return await hop(
            self.services.store.retry_model,
            self.lease,
            elapsed_ms=self.elapsed(),
            delay_s=delay_s,
            event=event,
        )

    async def add_event(self, kind: str, data: dict[str, Any]) -> None:
        await hop(self.services.store.add_event, self.lease, kind, data)

    async def lease_held(self) -> bool:
        return await hop(self.services.store.lease_held, self.lease)

    # -- liveness --------------------------------------------------------------------------

    def check_held(self) -> None:
        """Raise ``LeaseLost`` if the heartbeat found the run taken over: the owner then
        starts no further tool or model call (its writes are fenced anyway)."""
        self._held.check()

    def close(self) -> None:
        """Let go of the run: this process no longer keeps its lease alive."""
        self.services.heartbeat.drop(self._held)

    # -- helpers ---------------------------------------------------------------------------

    def idle(self, seconds: float) -> None:
        """Leave ``seconds`` just spent waiting for model capacity out of the active time."""
        self._mark += seconds

    def elapsed(self) -> int:
        """Active milliseconds since the last durable write, folded into the budget."""
        now = time.monotonic()
        delta = max(0, round((now - self._mark) * 1000))
        self._mark = now
        self.budget = self.budget.after_active(delta)
        return delta
