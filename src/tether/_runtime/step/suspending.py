"""A turn's suspension (reference §15): when a turn reaches its first call that needs a
human, every later call of the turn that needs one now is asked at the same time, each
with its own preview, digest and token; one notice is sent per call.

A later call is asked here only when it resolves (its tool exists, its arguments fit),
needs confirmation now, and renders its preview; any other later call is processed in
its turn, once the calls before it are carried out (a call that needs confirmation only
then suspends the run again). A call whose decision this session still holds is decided
already and is not asked again.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from tether._runtime.step import dry_run
from tether._runtime.step.resolution import Resolved, resolved
from tether._runtime.step.session import RunSession
from tether.messages import ToolCall
from tether.notify import Notice
from tether.previews import digest
from tether.results import Outcome, StopKind
from tether.runs import Pending, iso
from tether.telemetry.content import fields
from tether.tools.tool import ToolFailed

log = logging.getLogger(__name__)


def pending(
    session: RunSession,
    call: ToolCall,
    args: BaseModel,
    preview: dict[str, Any] | None,
    edited_from: dict[str, Any] | None = None,
    quorum: int = 1,
) -> Pending:
    """What the human is asked to decide of ``call``: with how many approvals it waits for
    (``quorum``) and, when its tool escalates, after how long (reference §19)."""
    tool = session.services.agent.tool(call.name)
    after_min = tool.escalate_after_min if tool is not None else None
    return Pending(
        tool_call_id=call.id,
        tool=call.name,
        arguments=args.model_dump(mode="json"),
        preview=preview,
        digest=digest(preview) if preview is not None else None,
        edited_from=edited_from,
        quorum=quorum,
        escalate_after_s=after_min * 60.0 if after_min is not None else None,
    )


async def suspend_turn(
    session: RunSession,
    call: ToolCall,
    args: BaseModel,
    preview: dict[str, Any] | None,
    *,
    edited_from: dict[str, Any] | None = None,
    quorum: int = 1,
) -> Outcome:
    """Suspend the run on ``call`` (its arguments ``args``, the ``preview`` rendered now;
    ``edited_from``: the model's arguments when ``args`` are an approver's edit; ``quorum``:
    how many approve it) and on every later call of its turn that needs confirmation now;
    send one notice per call."""
    asked = [pending(session, call, args, preview, edited_from, quorum)]
    calls = session.pending_calls()
    later = calls[[c.id for c in calls].index(call.id) + 1 :] if call in calls else []
    for other in later:
        if not session.decided(other.id):
            also = await _asked(session, other)
            if also is not None:
                asked.append(also)
    tokens, expires_at = await session.suspend(asked)
    if any(p.escalate_after_s is not None for p in asked):
        session.services.schedules_added.set()  # this process's timed work wakes for it (§19)
    notices = [
        Notice(
            run_id=session.run.id,
            user_id=session.run.user_id,
            token=token,
            approve_url=session.services.approve_url(token),
            tool=p.tool,
            arguments=p.arguments,
            preview=p.preview,
            expires_at=iso(expires_at) or "",
            tool_call_id=p.tool_call_id,
            pending_calls=len(asked),
            quorum=p.quorum,
            root_run_id=session.run.root_run_id,
            parent_run_id=session.run.parent_run_id,
        )
        for p, token in zip(asked, tokens, strict=True)
    ]
    for notice in notices:
        await session.services.outbox.post(notice)
    return Outcome(
        run_id=session.run.id, kind=StopKind.SUSPENDED, notice=notices[0], notices=notices
    )


async def _asked(session: RunSession, call: ToolCall) -> Pending | None:
    """A later call of the turn, when it needs a human's decision now."""
    r = resolved(session, call)
    if isinstance(r, Resolved) and not dry_run.skips(session, r.tool):
        try:
            if await r.tool.confirmation_needed(r.args, session.scope):
                preview = await r.tool.render_preview(r.args, session.scope)
                quorum = await r.tool.quorum_for(r.args, session.scope)
                return pending(session, call, r.args, preview, quorum=quorum)
        except ToolFailed as exc:  # asked in its turn, where its refusal is stored
            told = fields(session.services.settings.log_content, error=exc.message)
            log.info(
                "later call not asked now",
                extra={"run_id": session.run.id, "action": "suspend", "code": exc.code, **told},
            )
    return None
