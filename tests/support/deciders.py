"""A test agent whose calls are decided by teams (reference §19): ``pay`` waits on two
approvals (three over 10,000), ``wire`` on two people other than the owner, ``page`` is
escalated to the on-call group when nobody decides it in time, and ``sign`` both waits on
two approvals and is escalated. ``tether`` processes load it with ``--agent deciders:agent``
(they carry no run: the tests finish runs in process, with ``script``).

Who is in which group is read from the downstream's world (``group:USER`` = a comma list),
so a test changes a membership between two decisions and the resolver sees it at once
(invariant 7). ``dana``'s approvers are ``boss`` and the group ``finance``.
"""

from __future__ import annotations

from typing import Any

import downstream

from tether import Agent, Scope, ScriptedModel, ToolContext, tool

OWNER = "dana"
# The people a test puts in the finance group (``finance``).
FINANCE = ("ann", "bob", "cat")
ESCALATE_AFTER_MIN = 0.005  # 0.3 s: a test polls the reaper until the database clock passes it


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"to": args.to, "amount": args.amount}


def _quorum(args: Any, scope: Scope) -> int:
    return 3 if args.amount > 10_000 else 2


@tool(effect="write", needs_confirmation=True, dedupes=True, preview=_preview, quorum=_quorum)
def pay(ctx: ToolContext, to: str, amount: int) -> dict[str, Any]:
    """Pay someone: two people approve it (three over 10,000)."""
    return downstream.apply(ctx, "pay", f"{to}:{amount}", dedupe=True)


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    preview=_preview,
    quorum=2,
    approvers="others",
)
def wire(ctx: ToolContext, to: str, amount: int) -> dict[str, Any]:
    """Wire money: two people other than the owner approve it."""
    return downstream.apply(ctx, "wire", f"{to}:{amount}", dedupe=True)


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    preview=_preview,
    escalate_after_min=ESCALATE_AFTER_MIN,
    escalate_to=("group:oncall", "lead"),
)
def page(ctx: ToolContext, to: str, amount: int) -> dict[str, Any]:
    """Page someone: escalated to the on-call group and the lead when undecided."""
    return downstream.apply(ctx, "page", f"{to}:{amount}", dedupe=True)


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    preview=_preview,
    quorum=2,
    escalate_after_min=ESCALATE_AFTER_MIN,
    escalate_to=("group:oncall", "lead"),
)
def sign(ctx: ToolContext, to: str, amount: int) -> dict[str, Any]:
    """Sign a contract: two people approve it, and it is escalated when undecided."""
    return downstream.apply(ctx, "sign", f"{to}:{amount}", dedupe=True)


async def resolve(user_id: str) -> Scope:
    """``dana``'s approvers are ``boss`` and the finance group; everyone's groups come from
    the world (``group:USER``)."""
    listed = downstream.world(f"group:{user_id}", "")
    groups = frozenset(g for g in listed.split(",") if g)
    approvers = frozenset({"boss", "group:finance"}) if user_id == OWNER else frozenset()
    return Scope(user_id=user_id, approvers=approvers, groups=groups)


def join(user: str, *groups: str) -> None:
    """Put ``user`` in ``groups`` (none: in no group), as the directory says now."""
    downstream.set_world(f"group:{user}", ",".join(groups))


def finance() -> None:
    """Put ``FINANCE`` in the finance group."""
    for person in FINANCE:
        join(person, "finance")


def script(tool_name: str, amount: int = 500, calls: int = 1) -> ScriptedModel:
    """A model that calls ``tool_name`` ``calls`` times in one turn, then answers."""
    turn = [
        {"name": tool_name, "arguments": {"to": f"acct-{i}", "amount": amount}}
        for i in range(calls)
    ]
    return ScriptedModel([{"tool_calls": turn}, {"content": "done"}])


def agent() -> Agent:
    return Agent(
        name="kit-deciders",
        system_prompt="You are a test agent.",
        tools=(pay, wire, page, sign),
        resolve_scope=resolve,
    )
