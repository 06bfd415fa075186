"""tether: agent runs that survive interruption.

The names below are imported on first use (PEP 562): ``import tether`` (and so every
``tether`` command, whose modules live in this package) costs nothing until a name is
asked for, and ``from tether import Engine`` imports the engine then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.agent import Agent
    from tether.budget import Budget, Limits
    from tether.compaction import Compaction
    from tether.config import Settings
    from tether.engine import Engine
    from tether.engine.sync import SyncEngine
    from tether.errors import TetherError
    from tether.models import Model, ScriptedModel
    from tether.notify import MemoryNotifier, Notice, Notifier
    from tether.reasons import FailReason, HaltReason
    from tether.results import (
        ApprovalPreview,
        ApprovalResult,
        CallDecision,
        CallVerdict,
        Choice,
        Inbox,
        Outcome,
        ReapReport,
        RunPage,
        RunView,
        StopKind,
        TokenLookup,
        TreeView,
    )
    from tether.runs import Run, RunState
    from tether.scope import Scope
    from tether.tools.tool import (
        Approvers,
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

# Each public name and the module it comes from.
_HOMES = {
    "Agent": "tether.agent",
    "AuditPage": "tether.store.audit",
    "AuditRecord": "tether.store.audit",
    "ApprovalPreview": "tether.results",
    "ApprovalResult": "tether.results",
    "Approvers": "tether.tools.tool",
    "Budget": "tether.budget",
    "CallDecision": "tether.results",
    "CallVerdict": "tether.results",
    "Choice": "tether.results",
    "Compaction": "tether.compaction",
    "Effect": "tether.tools.tool",
    "Engine": "tether.engine",
    "FailReason": "tether.reasons",
    "GuardResult": "tether.tools.tool",
    "HaltReason": "tether.reasons",
    "Inbox": "tether.results",
    "Limits": "tether.budget",
    "MemoryNotifier": "tether.notify",
    "Model": "tether.models",
    "Notice": "tether.notify",
    "Notifier": "tether.notify",
    "Outcome": "tether.results",
    "OutcomeUnknown": "tether.tools.tool",
    "ReapReport": "tether.results",
    "Reconciled": "tether.tools.tool",
    "Run": "tether.runs",
    "RunPage": "tether.results",
    "RunState": "tether.runs",
    "RunView": "tether.results",
    "Scope": "tether.scope",
    "ScriptedModel": "tether.models",
    "Settings": "tether.config",
    "StopKind": "tether.results",
    "SyncEngine": "tether.engine.sync",
    "TetherError": "tether.errors",
    "TokenLookup": "tether.results",
    "TreeView": "tether.results",
    "Tool": "tether.tools.tool",
    "ToolContext": "tether.tools.tool",
    "ToolFailed": "tether.tools.tool",
    "ToolUnavailable": "tether.tools.tool",
    "Worker": "tether.worker",
    "tool": "tether.tools.tool",
}

__all__ = [
    "Agent",
    "ApprovalPreview",
    "ApprovalResult",
    "Approvers",
    "AuditPage",
    "AuditRecord",
    "Budget",
    "CallDecision",
    "CallVerdict",
    "Choice",
    "Compaction",
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
    "RunPage",
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
    "TreeView",
    "Worker",
    "tool",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use and kept here after."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tether' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
