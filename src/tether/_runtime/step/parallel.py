"""Calls of one stored turn that run together (reference §1, "Several calls in one turn"):
consecutive plain reads and writes declared ``concurrent`` (their effects commute with each
other and with reads), none of which may need confirmation. A plain write, or a call that
may need confirmation, runs alone (``loop.batches`` groups them).

A group runs every call at once, each resolved and re-checked as ``tool_call.first_call``
would, then stores the results one by one in the model's call order, reconciling in that
order each write whose outcome is not known (invariant 3). ``after_tool_commit`` fires for
the calls of a group once all of them returned: a crash there finds every write of the
group committed downstream and none of their results stored, so the next owner
reconciles each write of that group by its key (never re-runs it) and runs its reads again.
"""

from __future__ import annotations

import asyncio

from tether._runtime.step import dry_run
from tether._runtime.step.resolution import Resolved, refusal, resolved
from tether._runtime.step.session import RunSession
from tether._runtime.step.tool_call import (
    Check,
    first_call,
    invoke,
    recheck,
    reconcile,
    room_for,
    traced,
)
from tether._runtime.step.writes import Result
from tether.errors import LeaseLost
from tether.failpoints import fail
from tether.messages import ToolCall
from tether.results import Outcome
from tether.store import CallStatus
from tether.tools.tool import Effect, Tool


def joins(tool: Tool | None) -> bool:
    """Whether a call of ``tool`` may run beside its neighbours: a read, or a write
    declared ``concurrent``, that needs no confirmation (no tool at all: it is refused
    without running)."""
    if tool is None:
        return True  # a sub-agent's call is a concurrent write (reference §18)
    return not tool.may_confirm and (tool.effect is Effect.READ or tool.concurrent)


async def run_group(session: RunSession, calls: list[ToolCall]) -> Outcome | None:
    """Run ``calls`` (each one that ``joins``) concurrently and store their results in
    call order; a write whose outcome is unknown is reconciled in its place in that order.
    One at a time, through ``first_call``, when the tool-call budget could stop them
    partway. Returns an outcome when the run stopped, None when every result is stored.

    After a takeover every write of the group may have run (they ran together): each is
    reconciled by its key, never re-run; its reads simply run again."""
    recovering = session.take_recovering()
    writes = any(_runs_write(session, call) for call in calls)
    if not room_for(session, len(calls)) or (writes and session.trees.tree):
        # In a tree each write is counted as it runs, one by one (``RunSession.prepay``).
        return await _one_by_one(session, calls, recovering=recovering)
    session.check_held()
    if writes and not await session.lease_held():
        raise LeaseLost("this worker no longer owns the run", run_id=session.run.id)
    done = await _all(session, calls, recovering=recovering)
    for outcome in done:  # `after_tool_commit:TOOL`: all that ran returned, none stored
        if _ran(outcome, recovering=recovering):
            fail("after_tool_commit", outcome.call.name)
    for outcome in done:
        if isinstance(outcome, Resolved):  # a write whose outcome is not known
            stop = await reconcile(session, outcome, confirmed=False)
            if stop is not None:
                return stop
        elif isinstance(outcome, Result):
            await session.append_result(
                outcome.call, outcome.content, outcome.status, counted=outcome.counted
            )
            if outcome.status in (CallStatus.OK, CallStatus.SKIPPED):  # as ``dry_run.skip``
                fail("after_step_persist", outcome.call.name)
    return None


async def _all(
    session: RunSession, calls: list[ToolCall], *, recovering: bool
) -> list[Result | Resolved]:
    """Every call of the group started at once; what each returned, in call order. One
    that raised raises here once every call has ended: none is left running."""
    done = await asyncio.gather(
        *(_start(session, call, recovering=recovering) for call in calls),
        return_exceptions=True,
    )
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
    return [o for o in done if not isinstance(o, BaseException)]


async def _one_by_one(
    session: RunSession, calls: list[ToolCall], *, recovering: bool
) -> Outcome | None:
    """The group's calls in order, each through ``first_call`` (its own budget check);
    after a takeover each write of it is reconciled, as ``first_call`` does for the first."""
    for call in calls:
        r = resolved(session, call) if recovering and _runs_write(session, call) else None
        if isinstance(r, Resolved):
            stop = await reconcile(session, r, confirmed=False)
        else:
            stop = await first_call(session, call)
        if stop is not None:
            return stop
    return None


def _ran(outcome: Result | Resolved, *, recovering: bool) -> bool:
    """Whether the tool of a group's call ran: a result counted and not skipped, or a
    write whose outcome is unknown because it failed ambiguously (not a takeover's)."""
    if isinstance(outcome, Resolved):
        return not recovering
    return outcome.counted and outcome.status is not CallStatus.SKIPPED


def _runs_write(session: RunSession, call: ToolCall) -> bool:
    """Whether ``call`` is a write that executes (a dry run's writes never do)."""
    tool = session.services.agent.tool(call.name)
    return tool is not None and tool.effect is Effect.WRITE and not dry_run.skips(session, tool)


@traced
async def _start(session: RunSession, call: ToolCall, *, recovering: bool) -> Result | Resolved:
    """One call of a group, nothing stored: its result (a refusal, a dry run's skipped
    write, or what it returned), or the call itself when it is a write whose outcome is
    not known: it failed ambiguously, or it may have run before a takeover."""
    r = resolved(session, call)
    if isinstance(r, Result):
        return r
    if dry_run.skips(session, r.tool):  # never runs, nor is reconciled
        return Result(
            call=call,
            content=dry_run.would_call(call, r.args),
            status=CallStatus.SKIPPED,
            counted=True,
        )
    if recovering and r.tool.effect is Effect.WRITE:
        return r
    check = await recheck(session, r, confirmed=False)
    if check.verdict is Check.NOT_PERMITTED:
        return refusal(call, "not_permitted", f"{call.name} is not permitted for you")
    if check.verdict is not Check.PASSED:
        return refusal(call, "guard_failed", check.reason or "refused")
    invoked = await invoke(session, r, confirmed=False, committed=False)
    return r if invoked is None else invoked
