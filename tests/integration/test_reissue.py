"""A deduplicating write re-issued after an ambiguous failure (invariant 3, reference §10).

The re-issue runs under the same idempotency key, so the downstream answers it with the
first call's result if that call took effect. A re-issue that meets a downstream which is
*unavailable* has learnt nothing about the first call (it may have taken effect): it must
not reach the model as a failure, which the model would answer by calling again under a
new key, writing twice. The run fails ``unreconcilable`` instead, for a person to look at.
"""

from __future__ import annotations

from typing import Any

from tether import (
    Agent,
    Engine,
    MemoryNotifier,
    OutcomeUnknown,
    ScriptedModel,
    Settings,
    StopKind,
    ToolContext,
    ToolUnavailable,
    tool,
)
from tether.store import CallStatus

applied: list[str] = []
calls: list[str] = []


@tool(effect="write", dedupes=True)
def transfer(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Move money; the downstream deduplicates by key. Its first call takes effect and
    then loses its answer; every later call finds the downstream unavailable."""
    calls.append(ctx.idempotency_key)
    if len(calls) == 1:
        applied.append(ctx.idempotency_key)
        raise OutcomeUnknown("the answer was lost after the transfer committed")
    raise ToolUnavailable("the bank is down for maintenance")


async def test_a_reissue_that_finds_the_downstream_unavailable_fails_the_run_not_the_call(
    db_url: str,
) -> None:
    applied.clear()
    calls.clear()
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "transfer", "arguments": {"amount": 5}}]},
        # What a model told "transfer failed" would do: transfer again.
        {"tool_calls": [{"name": "transfer", "arguments": {"amount": 5}}]},
        {"content": "done"},
    ]
    engine = Engine(
        agent=Agent(name="bank", system_prompt="You move money.", tools=(transfer,)),
        model=ScriptedModel(turns),
        settings=Settings(database_url=db_url),
        notifier=MemoryNotifier(),
    )
    outcome = await engine.ask("dana", "move 5")
    ledger = await engine.ledger(outcome.run_id)
    engine.close()
    assert outcome.kind is StopKind.FAILED and outcome.reason == "unreconcilable"
    assert len(calls) == 2 and calls[0] == calls[1]  # the call, then its re-issue: one key
    assert [entry.status for entry in ledger] == [CallStatus.UNKNOWN]
    assert len(applied) == 1
