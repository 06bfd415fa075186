"""One tool call: resolve it, re-check it (permitted → preview → guard), execute it under
its idempotency key, and reconcile a write whose outcome is not known (invariant 3).

The same ``recheck`` serves a call met for the first time and a call a human decided
(``decided_call.py``); they differ only in what they do with its verdict.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from tether._runtime.step import approval_deadline, dry_run, suspending
from tether._runtime.step.budget_check import budget_stop, prepay
from tether._runtime.step.resolution import Resolved, refusal, resolved
from tether._runtime.step.session import RunSession
from tether._runtime.step.tool_retries import attempts, failure_content
from tether._runtime.step.writes import Result, error_content
from tether.errors import DatabaseUnavailable, FailpointError, LeaseLost
from tether.failpoints import fail
from tether.messages import ToolCall
from tether.previews import digest
from tether.reasons import FailReason
from tether.results import Outcome
from tether.store import CallStatus, idempotency_key
from tether.telemetry import tracing
from tether.telemetry.content import failure, fields
from tether.telemetry.metrics import TOOL_SECONDS
from tether.tools.tool import (
    Effect,
    OutcomeUnknown,
    Reconciled,
    ReconcileKind,
    Tool,
    ToolFailed,
    ToolUnavailable,
)

log = logging.getLogger(__name__)

# A downstream reconcile could not reach is asked again after RECONCILE_FIRST_S, doubling
# up to RECONCILE_MAX_S, until the settings' ``reconcile_patience_s``.
RECONCILE_FIRST_S = 0.25
RECONCILE_MAX_S = 15.0

P = ParamSpec("P")
R = TypeVar("R")


class Check(str, enum.Enum):
    """What re-checking a call found."""

    PASSED = "passed"
    NOT_PERMITTED = "no_longer_permitted"  # the user's scope does not allow it now
    CHANGED = "changed"  # the preview differs from the one the human approved
    GUARD_FAILED = "guard_failed"  # the guard refused, or a check could not run


@dataclass(frozen=True, kw_only=True)
class Recheck:
    """A call's verdict, with the preview rendered now (if the tool has one)."""

    verdict: Check
    preview: dict[str, Any] | None = None
    reason: str | None = None


async def resolve(session: RunSession, call: ToolCall) -> Resolved | None:
    """The call's tool and validated arguments; None when there is no such tool or the
    arguments do not fit, after storing why as the call's result for the model."""
    r = resolved(session, call)
    if isinstance(r, Result):
        await session.append_result(call, r.content, r.status, counted=False)
        return None
    return r


async def recheck(
    session: RunSession,
    r: Resolved,
    *,
    confirmed: bool,
    approved_digest: str | None = None,
) -> Recheck:
    """Is the call allowed now? In order: the user's scope (resolved now), the preview
    rendered now (compared with ``approved_digest`` when a human approved one), the guard.
    A check that cannot run refuses (fails closed)."""
    try:
        if not await r.tool.is_permitted(r.args, session.scope):
            return Recheck(verdict=Check.NOT_PERMITTED)
        preview = await r.tool.render_preview(r.args, session.scope)
        if confirmed and preview is not None and digest(preview) != approved_digest:
            return Recheck(verdict=Check.CHANGED, preview=preview)
        guard = await r.tool.check_guard(
            r.args, session.scope, session.ctx(r.call, confirmed=confirmed)
        )
    except ToolFailed as exc:
        reason = f"could not check this call: {exc.message}"
        return Recheck(verdict=Check.GUARD_FAILED, reason=reason)
    if not guard.ok:
        return Recheck(verdict=Check.GUARD_FAILED, reason=guard.reason or "refused")
    return Recheck(verdict=Check.PASSED, preview=preview)


def traced(
    fn: Callable[Concatenate[RunSession, ToolCall, P], Awaitable[R]],
) -> Callable[Concatenate[RunSession, ToolCall, P], Awaitable[R]]:
    """The call's ``execute_tool`` span around ``fn`` (``tracing.py``): its tool, effect
    and idempotency key, and its outcome: the result stored meanwhile (``append_result``),
    the result returned, or how the run stopped on it."""

    @functools.wraps(fn)
    async def call_span(session: RunSession, call: ToolCall, /, *args: P.args, **kw: P.kwargs) -> R:
        if not tracing.on():
            return await fn(session, call, *args, **kw)
        tool = session.services.agent.tool(call.name)
        key = idempotency_key(session.run.id, call.id)
        effect = tool.effect.value if tool is not None else None
        allowed = session.services.settings.otel_content
        arguments = call.arguments if allowed else None
        with tracing.tool_call(
            call.name, call.id, key=key, effect=effect, content=allowed, arguments=arguments
        ) as span:
            done = await fn(session, call, *args, **kw)
            if isinstance(done, Result):
                code, result = done.summary, done.content
                tracing.tool_outcome(
                    done.status.value, counted=done.counted, code=code, result=result
                )
            # A call's processing returns how the run stopped, bare or in a decision's
            # ``Resolution``.
            stop = done if isinstance(done, Outcome) else getattr(done, "outcome", None)
            if isinstance(stop, Outcome):
                span.set_outcome("tether.tool.outcome", stop.kind.value)
            return done

    return call_span


@traced
async def first_call(session: RunSession, call: ToolCall) -> Outcome | None:
    """Process a call no human has decided: reconcile it if it may have run before a
    crash, else re-check it and suspend it for confirmation or execute it. Returns an
    outcome when the run stopped, None when its result is stored and the loop goes on."""
    recovered = session.take_recovering()
    r = await resolve(session, call)
    if r is None:
        return None
    if dry_run.skips(session, r.tool):  # before all else: it never runs, nor is reconciled
        return await dry_run.skip(session, call, r.args)
    if recovered and r.tool.effect is Effect.WRITE and r.tool.needs_confirmation is not True:
        # It may have run before the crash (a conditional confirmation may have said no):
        # its outcome is asked by key, never re-run blindly.
        return await reconcile(session, r, confirmed=False)
    stop = await budget_stop(session, "tool")
    if stop is not None:
        return stop
    check = await recheck(session, r, confirmed=False)
    if check.verdict is Check.NOT_PERMITTED:
        await session.refuse(call, "not_permitted", f"{call.name} is not permitted for you")
        return None
    if check.verdict is not Check.PASSED:
        await session.refuse(call, "guard_failed", check.reason or "refused")
        return None
    if await r.tool.confirmation_needed(r.args, session.scope):
        try:  # how many approve it, asked now (reference §19); failing refuses the call
            quorum = await r.tool.quorum_for(r.args, session.scope)
        except ToolFailed as exc:
            await session.refuse(call, "guard_failed", f"could not check this call: {exc.message}")
            return None
        return await suspending.suspend_turn(session, call, r.args, check.preview, quorum=quorum)
    return await execute(session, r, confirmed=False)


def plain_read(tool: Tool | None) -> bool:
    """A call that may run before its turn is durable, and beside other such calls: a
    read that needs no confirmation (or no tool at all: it is refused without running)."""
    return tool is None or (tool.effect is Effect.READ and not tool.may_confirm)


async def read_step(session: RunSession, calls: list[ToolCall]) -> list[Result] | None:
    """The results of a turn whose calls are all plain reads, run concurrently before
    anything of the turn is written, so the turn and its results are one commit. None
    (nothing ran) when the turn holds another kind of call or the tool-call budget could
    stop it partway: the turn then takes the two-write path.

    A crash before that commit loses the turn and its reads, which have no effect: the
    next owner asks the model again from the stored messages (``after_reads``)."""
    if not all(plain_read(session.services.agent.tool(call.name)) for call in calls):
        return None
    if not room_for(session, len(calls)):
        return None
    results = await read_all(session, calls)
    for call in calls:  # `after_reads:TOOL` fires for a step that read with TOOL
        fail("after_reads", call.name)
    return results


def room_for(session: RunSession, count: int) -> bool:
    """Whether the budget allows ``count`` more tool calls without a halt between them."""
    ahead = session.budget.after_tool_calls(max(0, count - 1))
    return ahead.check_before_tool_call(session.run.limits) is None


async def read_all(session: RunSession, calls: list[ToolCall]) -> list[Result]:
    """Run plain reads concurrently; their results in call order. A read that raised
    raises here once every read has ended, so none is left running behind the run."""
    session.check_held()
    done = await asyncio.gather(*(read(session, call) for call in calls), return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
    return [r for r in done if isinstance(r, Result)]


@traced
async def read(session: RunSession, call: ToolCall) -> Result:
    """A plain read's result: refused (unknown, invalid, not permitted, guard), or run."""
    r = resolved(session, call)
    if isinstance(r, Result):
        return r
    check = await recheck(session, r, confirmed=False)
    if check.verdict is Check.NOT_PERMITTED:
        return refusal(call, "not_permitted", f"{call.name} is not permitted for you")
    if check.verdict is not Check.PASSED:
        return refusal(call, "guard_failed", check.reason or "refused")
    invoked = await invoke(session, r, confirmed=False)
    assert invoked is not None  # a read's failure is never ambiguous
    return invoked


async def invoke(
    session: RunSession,
    r: Resolved,
    *,
    confirmed: bool,
    maybe_ran: bool = False,
    committed: bool = True,
) -> Result | None:
    """Run the tool under the call's idempotency key, bounded by its timeout (a read that
    timed out or failed transiently is tried again, ``attempts``): its result, or None
    when a write timed out, failed ambiguously or raised an unexpected exception (it may
    have taken effect: the caller reconciles it). When an earlier call under this key
    ``maybe_ran``, a downstream that is unavailable is ambiguous too: this attempt learnt
    nothing of that one. A read that raised unexpectedly is a ``tool_error`` the model
    sees. Nothing is written; however many attempts, it is one tool call. ``committed``:
    ``after_tool_commit`` fires here (a group of calls fires it once all returned)."""
    call = r.call
    fail("before_tool_call", call.name)
    ctx = session.ctx(call, confirmed=confirmed)
    try:
        with TOOL_SECONDS.labels(tool=call.name).time():
            result = await attempts(session, r.tool, r.args, ctx)
    except (LeaseLost, DatabaseUnavailable, FailpointError):
        raise
    except Exception as exc:
        if committed:
            fail("after_tool_commit", call.name)
        return _failed(session, r, exc, maybe_ran=maybe_ran)
    if committed:
        fail("after_tool_commit", call.name)
    return Result(call=call, content=result, status=CallStatus.OK, counted=True)


def _failed(session: RunSession, r: Resolved, exc: Exception, *, maybe_ran: bool) -> Result | None:
    """What a call that raised ``exc`` returned: None when a write's outcome is unknown
    (ambiguous, or an exception no tool declares: it may have taken effect), else the
    error the model sees."""
    known = isinstance(exc, TimeoutError | OutcomeUnknown | ToolFailed)
    allowed = session.services.settings.log_content
    ids = {"run_id": session.run.id, "tool": r.call.name, "tool_call_id": r.call.id}
    if not known:
        log.error("tool raised", **failure(exc, allowed, action="tool_raised", **ids))
    ambiguous = not isinstance(exc, ToolFailed) or (maybe_ran and isinstance(exc, ToolUnavailable))
    if ambiguous and r.tool.effect is Effect.WRITE:
        log.warning("outcome unknown", **failure(exc, allowed, action="unknown", **ids))
        return None
    if known:
        content = failure_content(r.tool, cast(TimeoutError | OutcomeUnknown | ToolFailed, exc))
    else:
        content = error_content("tool_error", f"{type(exc).__name__}: {exc}"[:2000])
    return Result(call=r.call, content=content, status=CallStatus.ERROR, counted=True)


async def execute(
    session: RunSession,
    r: Resolved,
    *,
    confirmed: bool,
    reissue: bool = False,
    maybe_ran: bool = False,
) -> Outcome | None:
    """Run the tool once under the call's idempotency key and store its result. An
    ambiguous failure of a write is reconciled before the loop goes on (invariant 3); one
    of a ``reissue`` (reconciling's own) fails the run. ``maybe_ran``: a call under this
    key may have run before (a crash followed its approval)."""
    session.check_held()
    if r.tool.effect is Effect.WRITE:  # the lease checked (in a tree, the call counted)
        stop = await prepay(session, [r.call])
        if stop is not None:
            return stop
    result = await invoke(session, r, confirmed=confirmed, maybe_ran=reissue or maybe_ran)
    if result is None:
        if reissue:
            return await unreconcilable(session, r.call)
        return await reconcile(session, r, confirmed=confirmed)
    await session.append_result(r.call, r.shown(result.content), result.status, counted=True)
    if result.status is CallStatus.OK:
        fail("after_step_persist", r.call.name)
    return None


async def reconcile(session: RunSession, r: Resolved, *, confirmed: bool) -> Outcome | None:
    """Find out whether a write whose result is not stored took effect, and store what
    is learnt as its result: found → its result; a deduplicating downstream → re-issue
    under the same key; confirmed absent → "did not complete"; cannot tell → failed.

    Safe to run twice: it only reads the downstream by key, or re-issues under the same
    key, which a deduplicating downstream answers with the first result.
    """
    call = r.call
    found = await find_outcome(session, r, confirmed=confirmed)
    fail("after_outcome_found", call.name)
    tracing.tool_note("tether.tool.reconciled", found.kind.value)
    await session.add_event(
        "reconciled", {"tool_call_id": call.id, "tool": call.name, "found": found.kind.value}
    )
    if found.kind is ReconcileKind.FOUND:
        await session.append_result(call, r.shown(found.result), CallStatus.OK, counted=True)
    elif r.tool.dedupes:
        stop = await execute(session, r, confirmed=confirmed, reissue=True)
        if stop is not None:
            return stop
    elif found.kind is ReconcileKind.ABSENT:
        absent = error_content("not_completed", "this call did not complete; it had no effect")
        await session.append_result(call, r.shown(absent), CallStatus.ERROR, counted=False)
    else:
        return await unreconcilable(session, call)
    fail("after_reconcile", call.name)
    return None


async def settle_decided(session: RunSession, r: Resolved) -> tuple[bool, Outcome | None]:
    """Before executing an approved write again after a crash that followed its claim:
    did it already run? Returns (settled, stop): settled when its result is now stored or
    the run stopped (``stop``: cannot tell → failed); not settled when it must still run.

    Safe twice for the same reasons as ``reconcile``.
    """
    if r.tool.reconcile is None:
        if r.tool.dedupes:
            return False, None
        return True, await unreconcilable(session, r.call)
    found = await find_outcome(session, r, confirmed=True)
    if found.kind is ReconcileKind.FOUND:
        await session.append_result(r.call, r.shown(found.result), CallStatus.OK, counted=True)
        return True, None
    if found.kind in (ReconcileKind.UNKNOWN, ReconcileKind.UNREACHABLE) and not r.tool.dedupes:
        return True, await unreconcilable(session, r.call)
    return False, None


async def find_outcome(session: RunSession, r: Resolved, *, confirmed: bool) -> Reconciled:
    """Ask the tool, by the call's idempotency key, whether its write took effect. A
    downstream that cannot be reached now is not "cannot tell": it is asked again with a
    backoff for up to ``reconcile_patience_s`` while the heartbeat keeps the run's lease;
    only then is the answer ``unreachable`` for good (the run fails ``unreconcilable``)."""
    key = idempotency_key(session.run.id, r.call.id)
    deadline, bounded = approval_deadline.reconcile_deadline(session.services.settings)
    delay = RECONCILE_FIRST_S
    tries = 0
    while True:
        session.check_held()
        found = await r.tool.find_outcome(key, session.ctx(r.call, confirmed=confirmed))
        tries += 1
        if found.kind is not ReconcileKind.UNREACHABLE:
            return found
        if time.monotonic() + delay > deadline:
            approval_deadline.give_up(
                key, r.call.id, r.call.name, bounded=bounded
            )  # a request hands over
            log.error(
                "reconcile gave up",
                extra={"run_id": session.run.id, "action": "reconcile", "tries": tries},
            )
            return found
        log.warning(
            "reconcile could not ask; retrying",
            extra={
                "run_id": session.run.id,
                "action": "reconcile",
                "retry_in_s": delay,
                **fields(session.services.settings.log_content, error=found.result),
            },
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, RECONCILE_MAX_S)


async def unreconcilable(session: RunSession, call: ToolCall) -> Outcome:
    """Fail the run, keeping its ledger: a person must look at the downstream."""
    return await session.fail(
        FailReason.UNRECONCILABLE,
        {"tool_call_id": call.id, "tool": call.name},
        unknown_call=call.id,
    )
