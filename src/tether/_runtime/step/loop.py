"""The step loop: carries one claimed run to its next stop, one durable write per gap.

Durable writes of a step, in order (each a transaction, each fenced by the lease):
0. when the last model call reported more input tokens than the agent's compaction
   threshold, a compaction (``compaction.py``): the model is handed its view from then on;
1. the assistant turn, with its spend, step count and the ledger intents of its calls
   (a model call that failed writes no turn: see ``model_failures.py``);
2. for each tool call of the turn, in order: the tool's result with its counters.
A call that needs confirmation suspends the run instead. A turn whose calls are all plain
reads is one write: the reads run first, concurrently, and the turn is stored with their
results. Each gap between two writes is a named failpoint; what the next owner sees at
each one is in docs/step-protocol.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractContextManager

from tether import output
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether._runtime.step import children, compaction, model_call, parallel, tool_call
from tether._runtime.step.budget_check import budget_stop
from tether._runtime.step.decided_call import Resolution, decide
from tether._runtime.step.model_failures import model_failed
from tether._runtime.step.model_rate import model_capacity, model_ended
from tether._runtime.step.session import RunSession
from tether.errors import (
    DatabaseUnavailable,
    FailpointError,
    LeaseLost,
    ModelError,
)
from tether.failpoints import fail
from tether.messages import ToolCall
from tether.models.fallback import Answered
from tether.reasons import FailReason
from tether.results import Outcome, StopKind
from tether.runs import Run
from tether.sealing import MissingKey
from tether.store import CallStatus
from tether.telemetry import tracing
from tether.telemetry.content import failure, fields
from tether.telemetry.metrics import MODEL_SECONDS, STEP_SECONDS

log = logging.getLogger(__name__)


async def drive(session: RunSession) -> Outcome:
    """Process the last turn's unanswered calls, then ask the model, until a stop. Every
    way out is a returned outcome; an unexpected error fails the run (invariant 6). Traced
    as the run's stretch in this process, in the run's trace (``tracing.py``)."""
    run, agent = session.run, session.services.agent.name
    spans_content = session.services.settings.otel_content
    with (
        tracing.stretch(run.id, run.trace_context, agent, "carry", content=spans_content) as span,
        tracing.Steps(content=spans_content) as steps,
    ):
        outcome = await _guarded(session, steps)
        span.stopped(outcome)
        return outcome


async def _guarded(session: RunSession, steps: tracing.Steps) -> Outcome:
    try:
        return await _drive(session, steps)
    except LeaseLost:
        log.warning("lease lost", extra={"run_id": session.run.id, "action": "lease_lost"})
        return Outcome(run_id=session.run.id, kind=StopKind.LEASE_LOST)
    except DatabaseUnavailable:
        return session.abandon()  # never failed for a database that went away
    except (FailpointError, asyncio.CancelledError):
        raise
    except Exception as exc:
        return await session.fail_on_error(exc)
    finally:
        session.close()


async def process(
    session: RunSession, call: ToolCall, carried: dict[str, Resolution] | None = None
) -> Outcome | None:
    """One unanswered call: carry out its human decision if it has one (what became of it
    goes in ``carried``), else process it as met for the first time."""
    decision = session.take_decision(call.id)
    if decision is not None:
        resolution = await decide(session, call, decision, recovered=session.take_recovering())
        if carried is not None:
            carried[call.id] = resolution
        return resolution.outcome
    return await tool_call.first_call(session, call)


async def carry_calls(
    session: RunSession,
    carried: dict[str, Resolution] | None = None,
    *,
    decided_only: bool = False,
) -> Outcome | None:
    """The last turn's unanswered calls, in the model's order (in the groups of
    ``batches``), decided ones carried out as decided: how the run stopped on one of them,
    or None once each has its result (with ``decided_only``, once the last decided one
    has: the rest are the workers'). What became of each decided call goes in
    ``carried``."""
    for batch in batches(session, session.pending_calls()):
        if decided_only and not session.holds_decisions():
            return None
        if session.stopping:
            return await session.release("worker stopping")
        stop = await process_group(session, batch, carried)
        if stop is not None:
            return stop
    return None


async def _drive(session: RunSession, steps: tracing.Steps) -> Outcome:
    step_started: float | None = None
    failures = session.run.model_failures  # consecutive failed model calls, as stored
    if session.pending_calls():  # the rest of a step begun before this stretch
        steps.open(session.step, resumed=True)
    while True:
        stop = await carry_calls(session)
        if stop is not None:
            return stop
        if step_started is not None:  # the turn and all its calls are done
            STEP_SECONDS.observe(time.monotonic() - step_started)
        if session.stopping:
            return await session.release("worker stopping")
        stop = await compaction.compact_if_due(session, failures)  # a write of its own
        if stop is not None:
            return stop
        stop = await budget_stop(session, "model")
        if stop is not None:
            return stop
        fail("before_model_call")
        session.check_held()
        if not await model_capacity(session):  # the wait for it is not active time
            return await session.release("worker stopping")
        async with session.services.pacer.request() as waited:  # the process's CPU
            session.idle(waited)
            step_started = time.monotonic()
            steps.open(session.step + 1)
            try:
                with MODEL_SECONDS.time(), _chat_span(session) as chat:
                    answered = await _streamed(session)
                    chat.answered(answered.response)
                model_ended(session, answered.response.usage)
            except ModelError as exc:  # handed back with a delay, or failed (reference §10)
                return await model_failed(session, exc, failures)
        failures = 0  # the stored turn resets the stored count too
        fail("after_model_call")
        turn = session.turn_of(answered.response, model=answered.entry.spec)
        if not turn.calls:
            answer = turn.message.get("content")
            verdict = output.check(session.services.agent.output_type, answer)
            refused = await session.append_turn(turn, verdict=verdict)
            if refused is not None:  # its tree's steps were spent (reference §18)
                return refused
            STEP_SECONDS.observe(time.monotonic() - step_started)
            if verdict.errors:  # sent back with its errors, one step spent (reference §11)
                step_started = None
                continue
            shown = fields(session.services.settings.log_content, answer=answer)
            log.info("answered", extra={"run_id": session.run.id, "action": "answered", **shown})
            return Outcome(
                run_id=session.run.id,
                kind=StopKind.ANSWERED,
                answer=answer if isinstance(answer, str) else None,
                output=verdict.value,
            )
        results = await tool_call.read_step(session, turn.calls)
        refused = await session.append_turn(turn, results or ())  # a read-only step: one commit
        if refused is not None:
            return refused
        for result in results or ():
            if result.status is CallStatus.OK:
                fail("after_step_persist", result.call.name)
        if results is None:
            for call in turn.calls:  # `after_intent:TOOL` fires for a turn that calls TOOL
                fail("after_intent", call.name)


def _chat_span(session: RunSession) -> AbstractContextManager[tracing.Traced]:
    """The model call's ``chat`` span; what it is sent is on it only with
    ``TETHER_OTEL_CONTENT`` (``tracing.py``)."""
    allowed = session.services.settings.otel_content
    sent = compaction.view(session.conversation(), session.compaction) if allowed else None
    model, step = session.services.model.name, session.step + 1
    return tracing.model_call(model, step, content=allowed, messages=sent)


async def _streamed(session: RunSession) -> Answered:
    """The model's next turn (from the first model of the list that gives one, reference
    §21), its text handed to the run's watchers as it is written."""
    messages = compaction.view(session.conversation(), session.compaction)
    return await model_call.ask(
        session, messages, list(session.services.agent.tool_specs), streamed=True
    )


def batches(session: RunSession, pending: list[ToolCall]) -> list[list[ToolCall]]:
    """The pending calls in order, consecutive calls that may run together grouped: plain
    reads and writes declared ``concurrent`` that need no confirmation (``parallel.joins``).
    A plain write or a call that may need confirmation is always alone: the calls after it
    start once it has its result, and the calls before it have ended."""
    groups: list[list[ToolCall]] = []
    joined = False
    for call in pending:
        joins = parallel.joins(session.services.agent.tool(call.name))
        if joins and joined:
            groups[-1].append(call)
        else:
            groups.append([call])
        joined = joins
    return groups


async def process_group(
    session: RunSession, group: list[ToolCall], carried: dict[str, Resolution] | None = None
) -> Outcome | None:
    """One group of ``batches``: calls that run together (``parallel.run_group``), or a
    call alone (``process``); a group holding sub-agent calls starts (or collects) their
    children around its other calls (``children.carry``, reference §18)."""
    if children.holds_subagents(session, group):
        return await children.carry(
            session, group, lambda rest: process_group(session, rest, carried)
        )
    if len(group) > 1:
        return await parallel.run_group(session, group)
    return await process(session, group[0], carried)


async def carry(services: Services, run: Run, *, stopping: asyncio.Event | None = None) -> Outcome:
    """Start a run this process claimed and drive it to its next stop. A start that fails
    (its scope resolver is down, say) hands the run back with a delay and a
    ``start_failed`` event: it was claimed cleanly, so nothing is left to reconcile, and
    no recovery attempt is spent.

    Safe to run twice: the second start finds the lease moved and is fenced out.
    """
    try:
        session = await RunSession.start(services, run, stopping=stopping)
    except LeaseLost:
        return Outcome(run_id=run.id, kind=StopKind.LEASE_LOST)
    except DatabaseUnavailable:
        # Claimed, then the database went away: a reaper takes it once it is back.
        return Outcome(run_id=run.id, kind=StopKind.ABANDONED)
    except (FailpointError, asyncio.CancelledError):
        raise
    except MissingKey as exc:
        # A stored value this process cannot open (reference §20): trying again will not
        # help, so the run fails with the error naming the key.
        await hop(
            services.store.fail,
            run.lease(),
            reason=FailReason.ERROR,
            elapsed_ms=0,
            event={"error": exc.message, "code": exc.code},
        )
        return Outcome(run_id=run.id, kind=StopKind.FAILED, reason=FailReason.ERROR.value)
    except Exception as exc:
        allowed = services.settings.log_content
        log.error("start failed", **failure(exc, allowed, run_id=run.id, action="start_failed"))
        delay = services.settings.start_retry_s
        await hop(
            services.store.release,
            run.lease(),
            elapsed_ms=0,
            event={"error": f"{type(exc).__name__}: {exc}"[:2000], "retry_in_s": delay},
            delay_s=delay,
            kind="start_failed",
        )
        return Outcome(
            run_id=run.id, kind=StopKind.RELEASED, reason="start_failed", retry_in_s=delay
        )
    return await carry_session(session)


async def carry_session(session: RunSession) -> Outcome:
    """Drive a started session to its next stop (``drive``): a run just claimed, or an
    orphan its worker just reconciled (``recovery.recover``)."""
    outcome = await drive(session)
    if outcome.kind in _ENDS:
        # Its thread's next queued run, if any, is startable now; a worker's claim starts
        # it (a crash here leaves it queued for any worker).
        fail("after_run_end")
    return outcome


# The stops after which a run's thread is no longer busy because of it.
_ENDS = frozenset({StopKind.ANSWERED, StopKind.FAILED, StopKind.HALTED, StopKind.CANCELLED})
