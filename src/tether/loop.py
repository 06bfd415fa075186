"""The step loop: carries one claimed run to its next stop, one durable write per gap.

Durable writes of a step, in order (each a transaction, each fenced by the lease):
1. the assistant turn, with its spend, step count and the ledger intents of its calls;
2. for each tool call of the turn, in order: the tool's result with its counters.
A call that needs confirmation suspends the run instead (the pending call, its preview,
its digest and the token's hash). Each gap between two writes is a named failpoint; the
table of what the next owner sees at each one is in docs/step-protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from tether.agent import Agent
from tether.budget import Budget
from tether.config import Settings
from tether.errors import FailpointError, LeaseLost, NoLongerPermitted, TetherError
from tether.failpoints import fail
from tether.messages import ToolCall, pending_tool_calls, tool_calls_of, tool_result
from tether.metrics import MODEL_SECONDS, STEP_SECONDS, TOOL_SECONDS
from tether.models.base import Message, Model
from tether.models.pricing import spend_usd
from tether.notify import Notice, Notifier
from tether.runs import Lease, Pending, Run, RunState, iso
from tether.scope import Scope
from tether.store import CallStatus, Decision, Intent, Snapshot, Store, idempotency_key
from tether.tools import (
    InvalidToolArguments,
    OutcomeUnknown,
    ReconcileKind,
    Tool,
    ToolContext,
    ToolFailed,
    digest,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class StopKind(str, enum.Enum):
    """Why the loop returned."""

    ANSWERED = "answered"
    SUSPENDED = "suspended"
    HALTED = "halted"
    FAILED = "failed"
    RELEASED = "released"  # handed back to the workers, still running
    LEASE_LOST = "lease_lost"  # another owner took the run; this one wrote nothing more


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Where a run stopped. Control flow is returned, never raised to the loop's caller."""

    run_id: str
    kind: StopKind
    reason: str | None = None
    notice: Notice | None = None

    @property
    def state(self) -> RunState | None:
        return {
            StopKind.ANSWERED: RunState.ANSWERED,
            StopKind.SUSPENDED: RunState.SUSPENDED,
            StopKind.HALTED: RunState.HALTED,
            StopKind.FAILED: RunState.FAILED,
            StopKind.RELEASED: RunState.RUNNING,
        }.get(self.kind)


@dataclass(frozen=True, kw_only=True)
class Services:
    """What every driver shares: the store, the agent, the model, settings, the notifier."""

    store: Store
    agent: Agent
    model: Model
    settings: Settings
    notifier: Notifier
    approve_url: Callable[[str], str] = field(default=lambda token: f"/approve/{token}")


class CallVerdict(str, enum.Enum):
    """What became of one confirmed call (the approval path reports it)."""

    EXECUTED = "executed"
    DECLINED = "declined"
    GUARD_FAILED = "guard_failed"
    NO_LONGER_PERMITTED = "no_longer_permitted"
    CHANGED = "changed"


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The result of re-checking and executing an approved (or declined) call."""

    verdict: CallVerdict
    outcome: Outcome | None = None  # set when the run stopped (halted, suspended again)
    reason: str | None = None
    diff: list[dict[str, Any]] = field(default_factory=list)
    notice: Notice | None = None


def new_token() -> str:
    """A suspension token: 256 random bits, URL-safe. Never starts with "-", so it can be
    passed to a command line as an argument."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def hash_token(token: str) -> str:
    """The SHA-256 of a token: the only form of it that is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def error_content(code: str, message: str) -> dict[str, str]:
    """The body of a tool result that reports an error to the model."""
    return {"error": code, "message": message}


class Driver:
    """Carries one run, whose lease it holds, to its next stop."""

    def __init__(
        self,
        services: Services,
        snapshot: Snapshot,
        lease: Lease,
        scope: Scope,
        *,
        recovering: bool = False,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.s = services
        self.run: Run = snapshot.run
        self.messages: list[Message] = list(snapshot.messages)
        self.snapshot = snapshot
        self.lease = lease
        self.scope = scope
        self.budget: Budget = snapshot.run.budget
        # Only a run taken over from a dead owner may have a call whose effect happened
        # without its result being stored, and only the first unanswered one (calls run
        # in order). Everything else pending is known not to have run.
        self.recovering = recovering
        # Every tool call id of the run so far (kept as turns are added, not re-parsed).
        self._call_ids = {
            c.id for m in self.messages if m.get("role") == "assistant" for c in tool_calls_of(m)
        }
        # Set when this process is shutting down: the run is handed back at the next step
        # boundary so another worker takes it at once, without waiting for staleness.
        self.stopping = stopping
        self._mark = time.monotonic()

    # -- the loop ------------------------------------------------------------------------

    async def drive(self) -> Outcome:
        """Process the last turn's unanswered calls, then ask the model, until a stop."""
        try:
            return await self._drive()
        except LeaseLost:
            log.warning("lease lost", extra={"run_id": self.run.id, "action": "lease_lost"})
            return Outcome(run_id=self.run.id, kind=StopKind.LEASE_LOST)
        except (FailpointError, asyncio.CancelledError):
            raise
        except Exception as exc:
            return await self._fail_on_error(exc)

    async def _drive(self) -> Outcome:
        step_started: float | None = None
        while True:
            for call in pending_tool_calls(self.messages):
                if self.stopping is not None and self.stopping.is_set():
                    return await self.release("worker stopping")
                stop = await self.process_call(call)
                if stop is not None:
                    return stop
            if step_started is not None:  # the turn and all its calls are done
                STEP_SECONDS.observe(time.monotonic() - step_started)
            if self.stopping is not None and self.stopping.is_set():
                return await self.release("worker stopping")
            reason = self.budget.check_before_model_call(self.run.limits)
            if reason is not None:
                return await self.halt(reason)
            fail("before_model_call")
            step_started = time.monotonic()
            specs = list(self.s.agent.tool_specs)
            with MODEL_SECONDS.time():
                response = await self._keepalive(self.s.model.request(list(self.messages), specs))
            fail("after_model_call")
            message = self._normalized(response.message)
            calls = tool_calls_of(message)
            spend = spend_usd(response.model, response.usage)
            intents = [self._intent(call) for call in calls]
            event = {
                "step": self.budget.steps + 1,
                "tool_calls": [c.name for c in calls],
                "spend_usd": spend,
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
            }
            await self._hop(
                self.s.store.persist_turn,
                self.lease,
                message=message,
                spend_usd=spend,
                elapsed_ms=self._elapsed(),
                intents=intents,
                final=not calls,
                event=event,
            )
            self.messages.append(message)
            self.budget = Budget(
                steps=self.budget.steps + 1,
                spend_usd=self.budget.spend_usd + spend,
                tool_calls=self.budget.tool_calls,
                elapsed_ms=self.budget.elapsed_ms,
            )
            self.recovering = False
            if not calls:
                STEP_SECONDS.observe(time.monotonic() - step_started)
                log.info("answered", extra={"run_id": self.run.id, "action": "answered"})
                return Outcome(run_id=self.run.id, kind=StopKind.ANSWERED)
            for call in calls:  # `after_intent:TOOL` fires for a turn that calls TOOL
                fail("after_intent", call.name)

    async def process_call(self, call: ToolCall) -> Outcome | None:
        """Process one unanswered call: reconcile, suspend, refuse or execute it. Returns an
        outcome when the run stopped, None when its result is stored and the loop goes on."""
        first_recovered = self.recovering
        self.recovering = False
        tool = self.s.agent.tool(call.name)
        if tool is None:
            await self.store_result(
                call,
                error_content("unknown_tool", f"there is no tool {call.name!r}"),
                CallStatus.ERROR,
                counted=False,
            )
            return None
        try:
            args = tool.validate(call.parsed_arguments())
        except InvalidToolArguments as exc:
            await self.store_result(
                call, error_content(exc.code, exc.message), CallStatus.ERROR, counted=False
            )
            return None
        decision = self._decision_for(call)
        if decision is not None:
            return (
                await self.decide(call, tool, args, decision, recovered=first_recovered)
            ).outcome
        if first_recovered and tool.effect == "write" and not tool.needs_confirmation:
            return await self.reconcile(call, tool, args)
        reason = self.budget.check_before_tool_call(self.run.limits)
        if reason is not None:
            return await self.halt(reason)
        try:
            refusal = await self._refusal(call, tool, args)
            preview = None
            if refusal is None and tool.needs_confirmation:
                preview = await tool.render_preview(args, self.scope)
        except ToolFailed as exc:
            refusal = error_content("guard_failed", f"could not check this call: {exc.message}")
        if refusal is not None:
            await self.store_result(call, refusal, CallStatus.ERROR, counted=False)
            return None
        if tool.needs_confirmation:
            return await self.suspend(call, args, preview)
        return await self.execute(call, tool, args, confirmed=False)

    async def _refusal(self, call: ToolCall, tool: Tool, args: BaseModel) -> dict[str, str] | None:
        """Why the scope or the guard refuses ``call`` now, as a tool result; None if not."""
        if not await tool.is_permitted(args, self.scope):
            return error_content("not_permitted", f"{call.name} is not permitted for you")
        guard = await tool.check_guard(args, self.scope, self._ctx(call, confirmed=False))
        if not guard.ok:
            return error_content("guard_failed", guard.reason or "refused")
        return None

    # -- confirmation --------------------------------------------------------------------

    async def suspend(
        self, call: ToolCall, args: BaseModel, preview: dict[str, Any] | None
    ) -> Outcome:
        """Suspend on ``call`` with its rendered ``preview`` and a fresh token (only the
        token's hash is stored)."""
        fail("before_suspend", call.name)
        token = new_token()
        pending = Pending(
            tool_call_id=call.id,
            tool=call.name,
            arguments=args.model_dump(mode="json"),
            preview=preview,
            digest=digest(preview) if preview is not None else None,
        )
        expires_at = await self._hop(
            self.s.store.suspend,
            self.lease,
            pending=pending,
            token_hash=hash_token(token),
            ttl_s=self.s.settings.suspension_ttl_s,
            elapsed_ms=self._elapsed(),
            event={"tool": call.name, "tool_call_id": call.id, "digest": pending.digest},
        )
        fail("after_suspend", call.name)
        notice = Notice(
            run_id=self.run.id,
            user_id=self.run.user_id,
            token=token,
            approve_url=self.s.approve_url(token),
            tool=call.name,
            arguments=pending.arguments,
            preview=preview,
            expires_at=iso(expires_at) or "",
        )
        await deliver(self.s, notice)
        log.info("suspended", extra={"run_id": self.run.id, "action": "suspended"})
        return Outcome(run_id=self.run.id, kind=StopKind.SUSPENDED, notice=notice)

    async def decide(
        self,
        call: ToolCall,
        tool: Tool,
        args: BaseModel,
        decision: Decision,
        *,
        recovered: bool,
    ) -> Resolution:
        """Carry out a human decision on ``call``: decline, or re-resolve, re-render and
        re-guard, then execute (invariant 7).

        Safe to run twice (a crash after the claim hands it to the reaper): a recovered
        approval first asks the tool whether the write already happened, and a write is
        executed with the call's idempotency key.
        """
        if decision.decision == "decline":
            await self.store_result(
                call,
                error_content("declined_by_user", "the user declined this action"),
                CallStatus.ERROR,
                counted=False,
            )
            return Resolution(verdict=CallVerdict.DECLINED)
        if recovered and tool.reconcile is not None:
            found = await tool.find_outcome(
                idempotency_key(self.run.id, call.id), self._ctx(call, confirmed=True)
            )
            if found.kind is ReconcileKind.FOUND:
                await self.store_result(call, found.result, CallStatus.OK, counted=True)
                return Resolution(verdict=CallVerdict.EXECUTED)
            if found.kind is ReconcileKind.UNKNOWN and not tool.dedupes:
                return Resolution(
                    verdict=CallVerdict.EXECUTED, outcome=await self.unreconcilable(call)
                )
        elif recovered and not tool.dedupes:
            return Resolution(verdict=CallVerdict.EXECUTED, outcome=await self.unreconcilable(call))
        try:
            permitted = await tool.is_permitted(args, self.scope)
            preview = await tool.render_preview(args, self.scope) if permitted else None
            guard = await tool.check_guard(args, self.scope, self._ctx(call, confirmed=True))
        except ToolFailed as exc:
            reason = f"could not re-check this call: {exc.message}"
            await self.store_result(
                call, error_content("guard_failed", reason), CallStatus.ERROR, counted=False
            )
            return Resolution(verdict=CallVerdict.GUARD_FAILED, reason=reason)
        if not permitted:
            message = "your permissions changed while this was waiting; please ask again"
            await self.store_result(
                call,
                error_content("no_longer_permitted", message),
                CallStatus.ERROR,
                counted=False,
            )
            outcome = await self.halt(NoLongerPermitted.code)
            return Resolution(
                verdict=CallVerdict.NO_LONGER_PERMITTED, outcome=outcome, reason=message
            )
        if preview is not None and digest(preview) != decision.digest:
            before = self.run.pending.preview if self.run.pending else None
            suspended = await self.suspend(call, args, preview)
            return Resolution(
                verdict=CallVerdict.CHANGED,
                outcome=suspended,
                diff=diff_previews(before, preview),
                notice=suspended.notice,
            )
        if not guard.ok:
            await self.store_result(
                call,
                error_content("guard_failed", guard.reason or "refused"),
                CallStatus.ERROR,
                counted=False,
            )
            return Resolution(verdict=CallVerdict.GUARD_FAILED, reason=guard.reason)
        executed = await self.execute(call, tool, args, confirmed=True)
        return Resolution(verdict=CallVerdict.EXECUTED, outcome=executed)

    # -- execution and reconciliation ------------------------------------------------------

    async def execute(
        self,
        call: ToolCall,
        tool: Tool,
        args: BaseModel,
        *,
        confirmed: bool,
        reissue: bool = False,
    ) -> Outcome | None:
        """Run the tool once under the call's idempotency key and store its result. An
        ambiguous failure of a write is reconciled before the loop goes on (invariant 3)."""
        if tool.effect == "write" and not await self._hop(self.s.store.lease_held, self.lease):
            raise LeaseLost("this worker no longer owns the run", run_id=self.run.id)
        ctx = self._ctx(call, confirmed=confirmed)
        fail("before_tool_call", call.name)
        try:
            with TOOL_SECONDS.labels(tool=call.name).time():
                result = await self._keepalive(tool.call(args, ctx))
        except ToolFailed as exc:
            fail("after_tool_commit", call.name)
            await self.store_result(
                call, error_content(exc.code, exc.message), CallStatus.ERROR, counted=True
            )
            return None
        except OutcomeUnknown as exc:
            fail("after_tool_commit", call.name)
            if tool.effect != "write":
                await self.store_result(
                    call, error_content("tool_error", exc.message), CallStatus.ERROR, counted=True
                )
                return None
            log.warning("outcome unknown", extra={"run_id": self.run.id, "action": "unknown"})
            if reissue:
                return await self.unreconcilable(call)
            return await self.reconcile(call, tool, args, confirmed=confirmed)
        fail("after_tool_commit", call.name)
        await self.store_result(call, result, CallStatus.OK, counted=True)
        fail("after_step_persist", call.name)
        return None

    async def reconcile(
        self, call: ToolCall, tool: Tool, args: BaseModel, *, confirmed: bool = False
    ) -> Outcome | None:
        """Find out whether a write whose result is not stored took effect, and store what
        is learnt as its result: found → its result; a deduplicating downstream → re-issue
        under the same key; confirmed absent → "did not complete"; cannot tell → failed.

        Safe to run twice: it only reads the downstream by key, or re-issues under the same
        key, which a deduplicating downstream answers with the first result.
        """
        key = idempotency_key(self.run.id, call.id)
        found = await tool.find_outcome(key, self._ctx(call, confirmed=confirmed))
        await self._hop(
            self.s.store.add_event,
            self.run.id,
            "reconciled",
            {"tool_call_id": call.id, "tool": call.name, "found": found.kind.value},
        )
        if found.kind is ReconcileKind.FOUND:
            await self.store_result(call, found.result, CallStatus.OK, counted=True)
        elif tool.dedupes:
            stop = await self.execute(call, tool, args, confirmed=confirmed, reissue=True)
            if stop is not None:
                return stop
        elif found.kind is ReconcileKind.ABSENT:
            await self.store_result(
                call,
                error_content("not_completed", "this call did not complete; it had no effect"),
                CallStatus.ERROR,
                counted=False,
            )
        else:
            return await self.unreconcilable(call)
        fail("after_reconcile", call.name)
        return None

    async def unreconcilable(self, call: ToolCall) -> Outcome:
        """Fail the run, keeping its ledger: a person must look at the downstream."""
        await self._hop(
            self.s.store.fail,
            self.lease,
            reason="unreconcilable",
            elapsed_ms=self._elapsed(),
            event={"tool_call_id": call.id, "tool": call.name},
            unknown_call=call.id,
        )
        return Outcome(run_id=self.run.id, kind=StopKind.FAILED, reason="unreconcilable")

    async def store_result(
        self, call: ToolCall, content: Any, status: CallStatus, *, counted: bool
    ) -> None:
        """Store one tool result with its ledger outcome and counters (one transaction)."""
        message = tool_result(call.id, content)
        summary = (
            content.get("error")
            if isinstance(content, dict) and status is not CallStatus.OK
            else None
        )
        await self._hop(
            self.s.store.persist_tool_result,
            self.lease,
            tool_call_id=call.id,
            message=message,
            status=status,
            summary=summary,
            elapsed_ms=self._elapsed(),
            counted=counted,
            event={
                "tool": call.name,
                "tool_call_id": call.id,
                "status": status.value,
                **({"error": summary} if summary else {}),
            },
        )
        self.messages.append(message)
        if counted:
            self.budget = Budget(
                steps=self.budget.steps,
                spend_usd=self.budget.spend_usd,
                tool_calls=self.budget.tool_calls + 1,
                elapsed_ms=self.budget.elapsed_ms,
            )

    # -- stops -----------------------------------------------------------------------------

    async def halt(self, reason: str) -> Outcome:
        await self._hop(
            self.s.store.halt,
            self.lease,
            reason=reason,
            elapsed_ms=self._elapsed(),
            event={"budget": self.budget.to_json(), "limits": self.run.limits.to_json()},
        )
        log.info("halted", extra={"run_id": self.run.id, "action": "halted", "state": reason})
        return Outcome(run_id=self.run.id, kind=StopKind.HALTED, reason=reason)

    async def release(self, why: str) -> Outcome:
        """Hand the run back to the workers (still running, no owner)."""
        await self._hop(
            self.s.store.release, self.lease, elapsed_ms=self._elapsed(), event={"why": why}
        )
        return Outcome(run_id=self.run.id, kind=StopKind.RELEASED, reason=why)

    async def _fail_on_error(self, exc: Exception) -> Outcome:
        message = exc.message if isinstance(exc, TetherError) else f"{type(exc).__name__}: {exc}"
        log.exception("run failed", extra={"run_id": self.run.id, "action": "failed"})
        try:
            await self._hop(
                self.s.store.fail,
                self.lease,
                reason="error",
                elapsed_ms=self._elapsed(),
                event={"error": message[:2000]},
            )
        except LeaseLost:
            return Outcome(run_id=self.run.id, kind=StopKind.LEASE_LOST)
        return Outcome(run_id=self.run.id, kind=StopKind.FAILED, reason="error")

    # -- helpers ---------------------------------------------------------------------------

    def _decision_for(self, call: ToolCall) -> Decision | None:
        decision = self.snapshot.decisions.get(call.id)
        if decision is None:
            return None
        # A decision counts once: after it is carried out the call has a result.
        self.snapshot.decisions.pop(call.id, None)
        return decision

    def _intent(self, call: ToolCall) -> Intent:
        tool = self.s.agent.tool(call.name)
        arguments = call.parsed_arguments()
        return Intent(
            tool_call_id=call.id,
            tool=call.name[:128],
            arguments=arguments if isinstance(arguments, dict) else {"_raw": str(arguments)},
            effect=tool.effect.value if tool is not None else "read",
        )

    def _normalized(self, message: Message) -> Message:
        """The assistant message to store: role set, and every tool call with an id that
        is unique within the run (the id is the idempotency key's second half)."""
        out: Message = {**message, "role": "assistant"}
        raw_calls = out.get("tool_calls") or []
        if not raw_calls:
            out.pop("tool_calls", None)
            return out
        seen = self._call_ids
        fixed = []
        for i, raw in enumerate(raw_calls):
            call_id = str(raw.get("id") or f"call_{self.budget.steps}_{i}")[:100]
            while call_id in seen:
                call_id = f"{call_id}~{self.budget.steps}"
            seen.add(call_id)
            fixed.append({**raw, "id": call_id, "type": raw.get("type", "function")})
        out["tool_calls"] = fixed
        return out

    def _ctx(self, call: ToolCall, *, confirmed: bool) -> ToolContext:
        return ToolContext(
            run_id=self.run.id,
            user_id=self.run.user_id,
            tool_call_id=call.id,
            idempotency_key=idempotency_key(self.run.id, call.id),
            scope=self.scope,
            confirmed=confirmed,
        )

    def _elapsed(self) -> int:
        """Active milliseconds since the last durable write, folded into the budget."""
        now = time.monotonic()
        delta = max(0, round((now - self._mark) * 1000))
        self._mark = now
        self.budget = Budget(
            steps=self.budget.steps,
            spend_usd=self.budget.spend_usd,
            tool_calls=self.budget.tool_calls,
            elapsed_ms=self.budget.elapsed_ms + delta,
        )
        return delta

    async def _hop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One thread hop for one store transaction."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _keepalive(self, work: Awaitable[T]) -> T:
        """Await ``work``; if it outlasts a third of the heartbeat timeout, heartbeat in the
        background so the run is not taken for an orphan."""
        beat = asyncio.create_task(self._beat())
        try:
            return await work
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _beat(self) -> None:
        interval = self.s.settings.heartbeat_timeout_s / 3
        while True:
            await asyncio.sleep(interval)
            if not await self._hop(self.s.store.heartbeat, self.lease):
                log.warning("heartbeat refused", extra={"run_id": self.run.id, "action": "beat"})
                return


async def deliver(services: Services, notice: Notice) -> None:
    """Send a suspension notice and record its delivery. A notice that fails stays
    unrecorded, and the reaper re-issues it with a fresh token (``reissue_notices``)."""
    try:
        delivered = await services.notifier.send(notice)
    except Exception:
        log.exception("notice failed", extra={"run_id": notice.run_id, "action": "notify"})
        return
    if delivered is False:
        return
    await asyncio.to_thread(services.store.mark_notified, notice.run_id, hash_token(notice.token))


def diff_previews(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """Field-level differences between two previews: ``[{"path", "before", "after"}]``."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[dict[str, Any]] = []
        for key in sorted(set(before) | set(after), key=str):
            out.extend(
                diff_previews(
                    before.get(key), after.get(key), f"{path}.{key}" if path else str(key)
                )
            )
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out.extend(diff_previews(b, a, f"{path}[{i}]"))
        return out
    if before == after:
        return []
    return [{"path": path or "$", "before": before, "after": after}]
