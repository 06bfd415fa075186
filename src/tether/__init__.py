"""tether: agent runs that survive interruption."""

from __future__ import annotations

from tether.agent import Agent
from tether.budget import Budget, Limits
from tether.config import Settings
from tether.engine import Engine
from tether.errors import TetherError
from tether.models import Model, ScriptedModel
from tether.notify import MemoryNotifier, Notice, Notifier
from tether.reasons import FailReason, HaltReason
from tether.results import (
    ApprovalPreview,
    ApprovalResult,
    CallVerdict,
    Choice,
    Inbox,
    Outcome,
    ReapReport,
    RunView,
    StopKind,
    TokenLookup,
)
from tether.runs import Run, RunState
from tether.scope import Scope
from tether.sync import SyncEngine
from tether.tools.tool import (
    Effect,
    GuardResult,
    OutcomeUnknown,
    Reconciled,
    Tool,
    ToolContext,
    ToolFailed,
    ToolUnavailable,
    tool,
)
from tether.worker import Worker

__all__ = [
    "Agent",
    "ApprovalPreview",
    "ApprovalResult",
    "Budget",
    "CallVerdict",
    "Choice",
    "Effect",
    "Engine",
    "FailReason",
    "GuardResult",
    "HaltReason",
    "Inbox",
    "Limits",
    "MemoryNotifier",
    "Model",
    "Notice",
    "Notifier",
    "Outcome",
    "OutcomeUnknown",
    "ReapReport",
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
    "TokenLookup",
    "Tool",
    "ToolContext",
    "ToolFailed",
    "ToolUnavailable",
    "Worker",
    "tool",
]
