"""Compaction (reference §14): what an agent declares so that a long conversation reaches
the model as a summary and its last turns, while the stored messages stay whole.

``Agent(compaction=Compaction(max_input_tokens=N, keep_last_turns=K))``: when a model call
reports more than N input tokens, the next call sees the system message, one summary of
what came before, and the last K turns. The summary is written by the agent's model unless
``summarize`` is given: a function ``(messages) -> str``, sync or async. The view and the
cut are ``tether._runtime.step.compaction``'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tether.errors import ConfigError

# What ``summarize`` is handed (the messages to summarise, in OpenAI chat format) and gives.
Summarize = Callable[[list[dict[str, Any]]], "str | Awaitable[str]"]


@dataclass(frozen=True, kw_only=True)
class Compaction:
    """When to compact (a model call reported more than ``max_input_tokens`` input
    tokens), what to keep whole (the last ``keep_last_turns`` turns), and who writes the
    summary (``summarize``, or the agent's model when None). Checked when declared."""

    max_input_tokens: int
    keep_last_turns: int = 4
    summarize: Summarize | None = None

    def __post_init__(self) -> None:
        for name in ("max_input_tokens", "keep_last_turns"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"compaction: {name} must be a positive integer, got {value!r}")
        _check_summarize(self.summarize)


def _check_summarize(fn: object) -> None:
    """Refuse a ``summarize`` that tether could not call as ``summarize(messages)``. One
    whose signature Python cannot tell (some builtins) is trusted."""
    if fn is None:
        return
    if not callable(fn):
        raise ConfigError(f"compaction: summarize must be a function (messages) -> str, got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind([])
    except TypeError:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise ConfigError(
            f"compaction: summarize must take (messages): tether calls summarize(messages), "
            f"but {name}{signature} cannot be called that way. Declare it as "
            "def summarize(messages: list[dict]) -> str (or async def)"
        ) from None
