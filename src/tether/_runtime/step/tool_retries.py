"""A tool call's attempts (reference §10): a read that timed out or failed transiently is tried
again with a jittered exponential backoff; a write runs once. And what the model sees of
a call that failed."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from pydantic import BaseModel

from tether._runtime.step.session import RunSession
from tether._runtime.step.writes import error_content
from tether.telemetry.content import described, fields, kind
from tether.tools.tool import Effect, OutcomeUnknown, Tool, ToolContext, ToolFailed, ToolUnavailable

log = logging.getLogger(__name__)

# A read that timed out or failed transiently runs again after TOOL_RETRY_FIRST_S,
# doubling up to TOOL_RETRY_MAX_S (each pause jittered), at most its ``retries`` times.
TOOL_RETRY_FIRST_S = 0.2
TOOL_RETRY_MAX_S = 5.0
TRANSIENT = (TimeoutError, OutcomeUnknown, ToolUnavailable)


async def attempts(session: RunSession, tool: Tool, args: BaseModel, ctx: ToolContext) -> Any:
    """The tool's answer. A read that timed out or failed transiently (``TRANSIENT``) is
    tried again, up to its ``retries``, after a jittered exponential backoff; the last
    failure is raised. A write runs once: it is never run again blindly.

    Safe to run a read twice: it has no effect."""
    tries = 1 + (tool.retries if tool.effect is Effect.READ else 0)
    delay = TOOL_RETRY_FIRST_S
    for attempt in range(1, tries):
        try:
            return await tool.call(args, ctx)
        except TRANSIENT as exc:
            log.warning(
                "tool failed transiently; retrying",
                extra={
                    "run_id": session.run.id,
                    "action": "tool_retry",
                    "tool": tool.name,
                    "attempt": attempt,
                    "error_type": kind(exc),
                    **fields(session.services.settings.log_content, error=described(exc, True)),
                },
            )
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, TOOL_RETRY_MAX_S)
        session.check_held()
    return await tool.call(args, ctx)


def failure_content(tool: Tool, exc: TimeoutError | OutcomeUnknown | ToolFailed) -> dict[str, str]:
    """What the model sees of a call that failed: ``tool_timeout`` for a timeout,
    ``tool_unavailable`` for a transient failure, else the tool's error."""
    after = f" (tried {1 + tool.retries} times)" if tool.retries else ""
    if isinstance(exc, TimeoutError):
        return error_content("tool_timeout", (str(exc) or f"{tool.name} timed out") + after)
    if isinstance(exc, ToolUnavailable | OutcomeUnknown):
        return error_content("tool_unavailable", exc.message + after)
    return error_content(exc.code, exc.message)
