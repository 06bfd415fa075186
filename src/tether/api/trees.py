"""The JSON API's trees of sub-agents (reference §18): the tree a run belongs to, read
from any run of it by its owner."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tether.api.routes import AUTH, INVALID, Caller, EngineDep, json_router, responses
from tether.api.schemas import ConsumedOut, PendingCallOut, TreeBudgetOut
from tether.runs import RunState

router = json_router()


class TreeRunOut(BaseModel):
    """One run of a tree of sub-agents."""

    id: str
    parent_run_id: str | None
    parent_tool_call_id: str | None
    agent: str | None = Field(description="its agent's name")
    agent_version: str
    depth: int
    state: RunState
    halt_reason: str | None
    halted_by: str | None
    budget: TreeBudgetOut
    pending_calls: list[PendingCallOut] = Field(
        description="every call its suspension waits on, in call order; [] unless suspended"
    )


class TreeOut(BaseModel):
    """The tree of sub-agents a run belongs to: depth first, parents before children,
    siblings in call order."""

    root_run_id: str
    runs: list[TreeRunOut]
    consumed_tree: ConsumedOut = Field(description="the whole tree's consumption")


@router.get(
    "/runs/{run_id}/tree",
    response_model=TreeOut,
    tags=["runs"],
    summary="The tree of sub-agents a run belongs to",
    description="Every run of the tree of the run named (any run of it may be named): "
    "depth first, parents before children, siblings in call order, each with its state, "
    "budget (`consumed_tree` on a run with children) and the calls it waits on (§18).",
    responses=responses(
        (401, AUTH),
        (404, "`not_found`: no such run, or not the caller's"),
        (422, INVALID),
    ),
)
async def get_tree(run_id: str, user: Caller, engine: EngineDep) -> dict[str, Any]:
    return (await engine.get_tree(run_id, user=user)).to_json()
