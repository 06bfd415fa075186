"""tether: agent runs that survive interruption."""

from __future__ import annotations

from tether.agent import Agent
from tether.budget import Budget, Limits
from tether.config import Settings
from tether.engine import Engine, RunView, SyncEngine
from tether.errors import TetherError
from tether.loop import Outcome, StopKind
from tether.models import Model, ScriptedModel
from tether.notify import MemoryNotifier, Notice, Notifier
from tether.resume import ApprovalResult
from tether.runs import Run, RunState
from tether.scope import Scope
from tether.tools import (
    Effect,
    GuardResult,
    OutcomeUnknown,
    Reconciled,
    Tool,
    ToolContext,
    ToolFailed,
    tool,
)

__all__ = [
    "Agent",
    "ApprovalResult",
    "Budget",
    "Effect",
    "Engine",
    "GuardResult",
    "Limits",
    "MemoryNotifier",
    "Model",
    "Notice",
    "Notifier",
    "Outcome",
    "OutcomeUnknown",
    "Reconciled",
    "Run",
    "RunState",
    "RunView",
    "Scope",
    "ScriptedModel",
    "Settings",
    "StopKind",
    "SyncEngine",
    "TetherError",
    "Tool",
    "ToolContext",
    "ToolFailed",
    "tool",
]
