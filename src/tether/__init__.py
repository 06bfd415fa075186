"""tether: agent runs that survive interruption."""

from __future__ import annotations

from tether.agent import Agent
from tether.approval_preview import ApprovalPreview
from tether.approvals import ApprovalResult
from tether.budget import Budget, Limits
from tether.config import Settings
from tether.decision import CallVerdict, Choice
from tether.engine import Engine
from tether.errors import TetherError
from tether.models import Model, ScriptedModel
from tether.notify import MemoryNotifier, Notice, Notifier
from tether.outcome import Outcome, StopKind
from tether.reasons import FailReason, HaltReason
from tether.runs import Run, RunState
from tether.scope import Scope
from tether.service import Inbox, TokenLookup
from tether.sync import SyncEngine
from tether.tools import (
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
from tether.views import ReapReport, RunView

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
    "tool",
]
