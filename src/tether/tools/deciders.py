"""Who decides a tool's calls beyond its owner's scope (reference §19): a quorum of
distinct approvers (``@tool(quorum=N)``, a number or a function of the validated
arguments and the scope), and the people a call is escalated to when nobody decided it in
time (``@tool(escalate_after_min=M, escalate_to=(...))``). Checked when the tool is
declared (``invalid_tool``), not when a call first needs them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from tether import inputs
from tether.errors import InvalidInput, TetherError
from tether.scope import GROUP
from tether.tools.declaration import InvalidTool, check_signature

# The most approvals one call may wait for: more is a mistake, not a control.
MAX_QUORUM = 100
# The suspension window a declaration is checked against before an engine is built
# (``TETHER_SUSPENSION_TTL_MIN``, default 30); the engine checks again against its own.
DEFAULT_WINDOW_MIN = 30.0

Quorum = Callable[[Any, Any], Any]


def check_quorum(tool: str, quorum: object, *, confirms: bool) -> None:
    """``quorum`` is a whole number from 1 to ``MAX_QUORUM``, or a function of (arguments,
    scope); anything but 1 goes with a confirmation (there is nothing to approve else)."""
    if callable(quorum) and not isinstance(quorum, bool):
        check_signature(tool, "quorum", quorum)
    else:
        checked_quorum(tool, quorum, InvalidTool)
    if quorum != 1 and not confirms:
        raise InvalidTool(
            f"tool {tool}: quorum rules how many people approve a confirmation, and this "
            "tool needs none. Declare needs_confirmation, or drop quorum."
        )


def checked_quorum(tool: str, value: object, error: type[TetherError]) -> int:
    """``value`` as a quorum (a whole number from 1 to ``MAX_QUORUM``), or ``error``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUORUM:
        raise error(
            f"tool {tool}: quorum must be a whole number from 1 to {MAX_QUORUM}, or a function "
            f"of (arguments, scope) returning one, not {value!r:.100}"
        )
    return value


def check_escalation(
    tool: str, after_min: object, to: object, *, confirms: bool, window_min: float | None = None
) -> tuple[str, ...]:
    """``escalate_after_min`` (minutes, fractions allowed) is a number > 0 below the
    suspension window (``window_min``; by default the one the environment sets), and
    ``escalate_to`` names at least one user or ``"group:NAME"``; the two go together, and
    with a confirmation. Returns ``escalate_to`` as a tuple."""
    if after_min is None:
        if to:
            raise InvalidTool(
                f"tool {tool}: escalate_to names who a call is escalated to, but nothing says "
                "when: declare escalate_after_min too"
            )
        return ()
    if isinstance(after_min, bool) or not isinstance(after_min, int | float):
        raise InvalidTool(f"tool {tool}: escalate_after_min must be a number of minutes")
    window = window_min if window_min is not None else environment_window_min()
    if not math.isfinite(after_min) or not 0 < after_min < window:
        raise InvalidTool(
            f"tool {tool}: escalate_after_min must be > 0 and less than the suspension window "
            f"({window:g} min, TETHER_SUSPENSION_TTL_MIN), not {after_min!r}: the window "
            "bounds the whole suspension, so a later escalation would never happen"
        )
    if not confirms:
        raise InvalidTool(
            f"tool {tool}: escalate_after_min escalates a confirmation, and this tool needs "
            "none. Declare needs_confirmation, or drop the escalation."
        )
    return escalation_names(tool, to)


def escalation_names(tool: str, to: object) -> tuple[str, ...]:
    """``escalate_to`` as a tuple of user names and ``"group:NAME"`` (at least one)."""
    named = (to,) if isinstance(to, str) else to
    if not isinstance(named, tuple | list | frozenset | set) or not named:
        raise InvalidTool(
            f"tool {tool}: escalate_to must name at least one user or 'group:NAME', not {to!r:.100}"
        )
    out = []
    for name in named:
        try:
            out.append(_name(name))
        except InvalidInput as exc:
            raise InvalidTool(f"tool {tool}: escalate_to: {exc.message}") from None
    return tuple(dict.fromkeys(out))


def _name(name: object) -> str:
    if isinstance(name, str) and name.startswith(GROUP):
        inputs.user_id(name[len(GROUP) :], "a group's name")
        return name
    return inputs.user_id(name, "a user named in escalate_to")


def environment_window_min() -> float:
    """The suspension window the environment sets, in minutes (the default when unset or
    not a positive number: the engine's own settings refuse a bad value)."""
    raw = os.environ.get("TETHER_SUSPENSION_TTL_MIN")
    try:
        value = float(raw) if raw else DEFAULT_WINDOW_MIN
    except ValueError:
        return DEFAULT_WINDOW_MIN
    return value if math.isfinite(value) and value > 0 else DEFAULT_WINDOW_MIN
