"""Sub-agent calls (reference §18): a group of the turn's calls that holds some starts a
child run for each, goes ``waiting``, and, once its children have stopped, stores one
result per child in call order.

Durable writes, each one transaction fenced by the parent's lease:
1. the group's other calls, as any group's (``parallel.py``, ``tool_call.py``);
2. the new children (each with its first messages and ``created`` event), a
   ``child_started`` event each, and the parent ``waiting`` (``store.start_children``):
   failpoint ``after_children_started`` follows it;
3. once the transaction that stopped the last child made the parent ready and a worker
   claimed it (failpoint ``before_child_results``), one result per child, in call order.

Why each is safe twice: a child is unique per (parent, tool call id), so a parent that
dies before 2 commits started nothing (its successor starts each child once), and one
that dies after finds its children stored and starts none; a result is stored at the
message count its writer read, so 3 stores each result once whatever dies in between.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from tether._runtime.hop import hop
from tether._runtime.step import dry_run
from tether._runtime.step.budget_check import budget_stop
from tether._runtime.step.first_messages import first_messages
from tether._runtime.step.resolution import Resolved, resolved
from tether._runtime.step.session import RunSession
from tether._runtime.step.writes import Result, error_content
from tether.failpoints import fail
from tether.messages import ToolCall, tool_calls_of
from tether.reasons import HaltReason
from tether.results import Outcome, StopKind
from tether.runs import Run, RunState
from tether.store import CallStatus, StepRefused
from tether.store.records import ChildOf
from tether.tools.subagent import SubAgentTool

log = logging.getLogger(__name__)


def subagent(session: RunSession, call: ToolCall) -> SubAgentTool | None:
    """The sub-agent ``call`` hands its task to, or None for any other call."""
    tool = session.services.agent.tool(call.name)
    return tool if isinstance(tool, SubAgentTool) else None


def holds_subagents(session: RunSession, group: list[ToolCall]) -> bool:
    """Whether any call of ``group`` is a sub-agent call."""
    return bool(session.services.agent.subagents) and any(
        subagent(session, call) is not None for call in group
    )


def result_of(child: Run, tool: SubAgentTool) -> tuple[dict[str, Any], CallStatus]:
    """What a stopped child's parent gets as its call's result (reference §18)."""
    if child.state is RunState.ANSWERED:
        if tool.agent.output_type is not None:
            return {"output": child.output}, CallStatus.OK
        return {"answer": child.answer or ""}, CallStatus.OK
    if child.state is RunState.FAILED:
        content = error_content(
            "subagent_failed", f"the {tool.agent.name} agent failed ({child.fail_reason})"
        )
        return {**content, "fail_reason": child.fail_reason}, CallStatus.ERROR
    return (
        error_content("cancelled", f"the {tool.agent.name} agent's run was cancelled"),
        CallStatus.ERROR,
    )


async def carry(
    session: RunSession,
    group: list[ToolCall],
    others: Callable[[list[ToolCall]], Awaitable[Outcome | None]],
) -> Outcome | None:
    """The group's calls: the results of children that stopped first (in call order),
    then the group's other calls (``others``, an async function of them), then a child
    for each sub-agent call without one, the parent waiting while any child goes on.
    Returns how the run stopped (``waiting`` included), or None when every call of the
    group has its result."""
    subs = [call for call in group if subagent(session, call) is not None]
    rest = [call for call in group if subagent(session, call) is None]
    existing = {
        c.parent_tool_call_id: c for c in await hop(session.services.store.children, session.run.id)
    }
    done = [call for call in subs if call.id in existing and existing[call.id].state.terminal]
    if done:
        fail("before_child_results")
        for call in done:
            tool = subagent(session, call)
            assert tool is not None
            content, status = result_of(existing[call.id], tool)
            # Counted as a tool call when its child started (``start_children``).
            await session.append_result(call, content, status, counted=False)
    if rest:
        stop = await others(rest)
        if stop is not None:
            return stop
    going = [call for call in subs if call.id in existing and not existing[call.id].state.terminal]
    new = [call for call in subs if call.id not in existing]
    starting: list[Resolved] = []
    for call in new:
        r = resolved(session, call)
        if isinstance(r, Result):  # not a task: refused, nothing started
            await session.append_result(call, r.content, r.status, counted=False)
            continue
        if dry_run.skips(session, r.tool):  # a dry run starts no child
            stop = await dry_run.skip(session, call, r.args)
            if stop is not None:
                return stop
            continue
        if session.run.depth >= session.services.settings.max_depth:
            message = (
                f"this run is at depth {session.run.depth}, the deepest a tree may go "
                "(TETHER_MAX_DEPTH): no sub-agent was started"
            )
            await session.refuse(call, "depth_exceeded", message)
            continue
        starting.append(r)
    if starting:
        stop = await budget_stop(session, "tool", len(starting))
        if stop is not None:
            return stop
    if not starting and not going:
        return None
    order = {c.id: i for i, c in enumerate(_turn_calls(session))}
    children = [_child(session, r, order.get(r.call.id, 0)) for r in starting]
    stop = await _start(session, children)
    if stop is None:
        return None  # every child had stopped already: the next pass stores their results
    if stop.kind is StopKind.WAITING:
        fail("after_children_started")
    return stop


async def _start(session: RunSession, children: list[dict[str, Any]]) -> Outcome | None:
    """Store ``children`` (new child runs' fields; their calls counted as the parent's tool
    calls now) and go ``waiting`` while any child of the run is still going
    (``store.start_children``): the ``waiting`` outcome, after which the session no longer
    holds the run; a halt when the calls would pass a limit of the tree; None when the run
    goes on (every child had stopped already)."""
    run = session.run
    try:
        waits = await hop(
            session.services.store.start_children,
            session.lease,
            children=children,
            elapsed_ms=session.elapsed(),
            root_run_id=run.root_run_id,
        )
    except StepRefused as refused:
        return await session.halt(HaltReason(refused.reason), halted_by=refused.halted_by)
    session.budget = session.budget.after_tool_calls(len(children))
    if not waits:
        return None
    log.info("waiting", extra={"run_id": run.id, "action": "waiting"})
    return Outcome(run_id=run.id, kind=StopKind.WAITING)


def _child(session: RunSession, r: Resolved, order: int) -> dict[str, Any]:
    """The fields of a new child run (``store.insert_run``) for the sub-agent call ``r``."""
    tool = r.tool
    assert isinstance(tool, SubAgentTool)
    run = session.run
    agent = tool.agent
    task = r.args.model_dump()["task"]
    return {
        "run_id": uuid.uuid4().hex,
        "user_id": run.user_id,
        "question": task,
        "route": {
            "agent": agent.name,
            **({"limits": sorted(tool.child_limits)} if tool.child_limits else {}),
        },
        "limits": tool.limits_for(session.trees.root_limits),
        "scope": session.scope.to_json(),
        "versions": agent.versions(),
        "agent_version": agent.agent_version,
        "messages": first_messages(agent, task, follow_up=False),
        "trace_context": run.trace_context,
        "priority": run.priority,
        "parent": ChildOf(
            run_id=run.id,
            tool_call_id=r.call.id,
            root_run_id=run.root_run_id,
            depth=run.depth + 1,
            order=session.step * 1000 + order,
        ),
    }


def _turn_calls(session: RunSession) -> list[ToolCall]:
    """The calls of the run's last assistant turn, in the model's order."""
    for message in reversed(session.messages):
        if message.get("role") == "assistant":
            return tool_calls_of(message)
    return []
