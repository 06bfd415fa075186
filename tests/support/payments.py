"""An agent whose writes read what its writes change: ``pay`` moves money out of one
balance (on the test downstream, ``downstream.py``), and its preview shows the balance it
would leave. A turn of several payments is one suspension (reference §15), and once the
first is carried out the next one's re-rendered preview differs from the one approved:
it is ``changed`` (invariant 7), whatever the approver meant. ``cap`` in the world makes
the guard refuse every payment above it, ``floor`` makes a payment below it no longer
permitted; ``pay_outside`` moves the balance from elsewhere.

- ``agent()``: ``pay`` and a ``lookup`` read, playing the script its question names
  (``"script:NAME ..."``, else ``two_payments``): ``two_payments`` (pay 30, a read, pay
  20), ``three_payments`` (pay 10, 20, 30).
"""

from __future__ import annotations

from typing import Any

import agents
import downstream

from tether import Agent, GuardResult, Scope, ScriptedModel, ToolContext, tool
from tether.models.base import Message, Model, ModelResponse, ToolSpec

START = 100  # the balance before any payment


def balance() -> int:
    """What is left: the start less every payment carried out downstream."""
    return START - sum(int(item) for _, name, item in downstream.effects() if name == "pay")


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"amount": args.amount, "balance_after": balance() - args.amount}


def _guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    cap = downstream.world("cap")
    if cap and args.amount > int(cap):
        return GuardResult.refuse(f"payments above {cap} are blocked")
    return GuardResult.allow()


def _permitted(args: Any, scope: Scope) -> bool:
    floor = downstream.world("floor")
    return not floor or args.amount >= int(floor)


def pay_outside(amount: int) -> None:
    """A payment made elsewhere: the balance moves without any call of the run."""
    downstream.note_execution("outside", "pay", str(amount))


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    reconcile=downstream.find,
    preview=_preview,
    guard=_guard,
    permitted=_permitted,
)
def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Pay ``amount`` out of the balance: a write a human must confirm."""
    return downstream.apply(ctx, "pay", str(amount), dedupe=True)


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "two_payments": [
        {
            "tool_calls": [
                agents.call("pay", amount=30),
                agents.call("lookup", query="x"),
                agents.call("pay", amount=20),
            ]
        },
        {"content": "paid"},
    ],
    "three_payments": [
        {
            "tool_calls": [
                agents.call("pay", amount=10),
                agents.call("pay", amount=20),
                agents.call("pay", amount=30),
            ]
        },
        {"content": "paid"},
    ],
}


class ByQuestion(Model):
    """Plays the script the run's question names (``"script:NAME ..."``), else
    ``two_payments``."""

    name = "scripted:payments"

    def __init__(self) -> None:
        self._models: dict[str, ScriptedModel] = {}

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        question = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        first = question.split(maxsplit=1)[0] if question.strip() else ""
        name = first.removeprefix("script:") if first.startswith("script:") else "two_payments"
        if name not in self._models:
            self._models[name] = ScriptedModel(SCRIPTS[name])
        return await self._models[name].request(messages, tools)


def agent() -> Agent:
    """``pay`` and ``lookup``; the scope's approver is ``boss`` (``agents.resolve``)."""
    return Agent(
        name="kit-payments",
        system_prompt="You are a test agent.",
        tools=(agents.lookup, pay),
        resolve_scope=agents.resolve,
        default_model=ByQuestion,
    )
