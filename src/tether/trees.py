"""A tree of sub-agents as a caller reads it (reference §18): ``Engine.get_tree`` returns a
``TreeView`` (re-exported by ``tether.results`` beside the other records it returns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.budget import Budget
from tether.runs import Run, RunState

__all__ = ["TreeView"]


@dataclass(frozen=True, kw_only=True)
class TreeView:
    """A tree of sub-agents as a caller reads it (reference §18): every run of the tree of
    the run asked about, parents before children, siblings in call order, and each run's
    ``consumed_tree`` (its own consumption plus all its descendants')."""

    root_run_id: str
    runs: list[Run]
    consumed: dict[str, Budget]

    @property
    def consumed_tree(self) -> Budget:
        """The whole tree's consumption: the root's ``consumed_tree``."""
        return self.consumed.get(self.root_run_id, Budget())

    def pending_calls(self, run: Run) -> list[dict[str, Any]]:
        """The calls ``run`` waits on a decision for, as the tree lists them."""
        if run.state is not RunState.SUSPENDED:
            return []
        return [c.to_json(run.expires_at) for c in run.suspension_calls() if c.decided is None]

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/runs/{id}/tree`` (reference §18)."""
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
                        "consumed_tree": self.consumed.get(run.id, run.budget).to_json(),
                    },
                    "pending_calls": self.pending_calls(run),
                }
                for run in self.runs
            ],
            "consumed_tree": self.consumed_tree.to_json(),
        }
