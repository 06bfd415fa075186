"""What a step is about to store: an assistant turn and a tool call's result, and the body
of a result that reports an error to the model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.messages import ToolCall, tool_calls_of
from tether.models.base import Message, ModelResponse
from tether.models.pricing import Price, spend_usd
from tether.store import CallStatus, Intent

if TYPE_CHECKING:
    from tether.agent import Agent


def intent(agent: Agent, call: ToolCall, result: Result | None = None) -> Intent:
    """The ledger entry stored with the turn that asks for ``call`` (an intent, or the
    outcome of a call that ran before its turn was stored, ``result``)."""
    tool = agent.tool(call.name)
    arguments = call.parsed_arguments()
    return Intent(
        tool_call_id=call.id,
        tool=call.name[:128],
        arguments=arguments if isinstance(arguments, dict) else {"_raw": str(arguments)},
        effect=tool.effect.value if tool is not None else "read",
        status=CallStatus.INTENT if result is None else result.status,
    )


def error_content(code: str, message: str) -> dict[str, str]:
    """The body of a tool result that reports an error to the model."""
    return {"error": code, "message": message}


@dataclass(frozen=True, kw_only=True)
class Turn:
    """An assistant turn about to be stored: its message, calls, spend and trace data, and
    the input tokens its model call reported (the trigger of compaction, reference §14)."""

    message: Message
    calls: list[ToolCall]
    spend: float
    event: dict[str, Any]
    input_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Result:
    """A tool call's result about to be stored; ``counted`` when the tool ran."""

    call: ToolCall
    content: Any
    status: CallStatus
    counted: bool

    @property
    def summary(self) -> Any:
        """The error code of a result that is not ``ok``, for its trace event and span."""
        if isinstance(self.content, dict) and self.status is not CallStatus.OK:
            return self.content.get("error")
        return None

    def event(self) -> dict[str, Any]:
        """Its ``tool_result`` trace event's data (every result is traced)."""
        summary = self.summary
        return {
            "tool": self.call.name,
            "tool_call_id": self.call.id,
            "status": self.status.value,
            **({"error": summary} if summary else {}),
        }


def turn_of(
    response: ModelResponse,
    *,
    step: int,
    prices: Mapping[str, Price],
    taken: set[str],
    suffix: str | None = None,
    model: str,
) -> Turn:
    """The assistant turn ``step`` of ``response`` as it is to be stored, with the
    ``model`` that wrote it (its ``TETHER_MODEL`` entry, reference §21) and its spend at
    ``prices``: its tool call ids made unique among those ``taken`` (added to it) and, in
    a child run, across its tree by ``suffix`` (its run id, reference §18)."""
    spend = spend_usd(response.model, response.usage, prices, entry=model)
    message = _normalized(response.message, step - 1, taken, suffix)
    calls = tool_calls_of(message)
    content = message.get("content")
    event = {
        "step": step,
        "model": model,
        "text": content if isinstance(content, str) else "",
        "tool_calls": [c.name for c in calls],
        "spend_usd": spend,
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
    }
    tokens = response.usage.input_tokens
    return Turn(message=message, calls=calls, spend=spend, event=event, input_tokens=tokens)


def _normalized(message: Message, step: int, taken: set[str], suffix: str | None = None) -> Message:
    """The assistant message to store: role set, and every tool call with an id that is
    unique within the run's conversation (the id is the idempotency key's second half)."""
    out: Message = {**message, "role": "assistant"}
    raw_calls = out.get("tool_calls") or []
    if not raw_calls:
        out.pop("tool_calls", None)
        return out
    fixed = []
    for i, raw in enumerate(raw_calls):
        call_id = str(raw.get("id") or f"call_{step}_{i}")[: 64 if suffix else 100]
        if suffix:
            call_id = f"{call_id}-{suffix}"
        while call_id in taken:
            call_id = f"{call_id}~{step}"
        taken.add(call_id)
        fixed.append({**raw, "id": call_id, "type": raw.get("type", "function")})
    out["tool_calls"] = fixed
    return out
