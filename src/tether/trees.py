"""A tree of sub-agents as a caller reads it (reference §18): ``Engine.get_tree`` returns a
``TreeView`` (re-exported by ``tether.results`` beside the other records it returns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.budget import Budget
from tether.runs import Run, RunState, run_to_json

__all__ = ["TreeView", "depth_first"]


@dataclass(frozen=True, kw_only=True)
class TreeView:
    """A tree of sub-agents as a caller reads it (reference §18): every run of the tree of
    the run asked about, depth first (parents before children, siblings in call order),
    and each run's ``consumed_tree`` (its own consumption plus all its descendants')."""

    root_run_id: str
    runs: list[Run]
    consumed: dict[str, Budget]

    @property
    def consumed_tree(self) -> Budget:
        """The whole tree's consumption: the root's ``consumed_tree``."""
        return self.consumed.get(self.root_run_id, Budget())

    def children_of(self, run_id: str) -> list[Run]:
        """The children of ``run_id``, in call order."""
        return [r for r in self.runs if r.parent_run_id == run_id]

    def pending_calls(self, run: Run) -> list[dict[str, Any]]:
        """The calls ``run``'s suspension waits on, as its own JSON lists them."""
        if run.state is not RunState.SUSPENDED:
            return []
        return [c.to_json(run.expires_at) for c in run.suspension_calls()]

    def run_json(self, run: Run) -> dict[str, Any]:
        """``run`` (one of the tree's, as an action left it) as its own JSON: with its
        children and its ``consumed_tree`` (reference §6, §18)."""
        children = self.children_of(run.id)
        return run_to_json(run, children=children, consumed_tree=self.consumed.get(run.id))

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/runs/{id}/tree`` (reference §18)."""
        parents = {r.parent_run_id for r in self.runs}
        return {
            "root_run_id": self.root_run_id,
            "runs": [
                {
                    "id": run.id,
                    "parent_run_id": run.parent_run_id,
                    "parent_tool_call_id": run.parent_tool_call_id,
                    "agent": run.route.get("agent"),
                    "agent_version": run.agent_version,
                    "depth": run.depth,
                    "state": run.state.value,
                    "halt_reason": run.halt_reason,
                    "halted_by": run.halted_by,
                    "budget": {
                        "limits": run.limits.to_json(),
                        "consumed": run.budget.to_json(),
                        "consumed_tree": (
                            self.consumed[run.id].to_json() if run.id in parents else None
                        ),
                    },
                    "pending_calls": self.pending_calls(run),
                }
                for run in self.runs
            ],
            "consumed_tree": self.consumed_tree.to_json(),
        }


def depth_first(found: list[Run]) -> list[Run]:
    """The runs of a tree (parents before children, siblings in call order) in depth-first
    order: each run followed by its whole subtree, as ``tether runs tree`` indents them."""
    children: dict[str | None, list[Run]] = {}
    for run in found:
        children.setdefault(run.parent_run_id, []).append(run)
    ordered: list[Run] = []
    stack = list(reversed(children.get(None, found[:1])))
    while stack:
        run = stack.pop()
        ordered.append(run)
        stack.extend(reversed(children.get(run.id, [])))
    if len(ordered) < len(found):  # a run whose parent is gone: listed after the rest
        seen = {r.id for r in ordered}
        ordered.extend(r for r in found if r.id not in seen)
    return ordered
