"""An approval's request that cannot learn a write's outcome in time (reference §4): the
request that carries an approval answers within ``approval_reconcile_s`` of its claim,
even when the approved write's answer was lost and the lookup by key cannot reach the
downstream either. Past that bound the run is handed over to the reapers, whose recovery
carries the reconciliation on (invariant 3: asked by key, never run a second time), and
the approver is answered ``reconciling``; the end is in the run's events.

The bound is the context of the request's carrying-out (``answering_within``), so every
other reconciliation (a worker's, a reaper's) keeps the whole ``reconcile_patience_s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tether.config import Settings
from tether.tools._timeouts import still_running

# The monotonic time by which the approval request being carried out here must answer.
_ANSWER_BY: ContextVar[float | None] = ContextVar("tether_answer_by", default=None)


class HandOver(Exception):
    """The approval's request ran out of time to reconcile ``tool_call_id``: hand the run
    over (``RunSession.hand_over``) and answer ``reconciling``."""

    def __init__(self, tool_call_id: str, tool: str) -> None:
        super().__init__(f"{tool} ({tool_call_id}) is still being reconciled")
        self.tool_call_id = tool_call_id
        self.tool = tool


@contextmanager
def answering_within(seconds: float) -> Iterator[None]:
    """Carry out an approval that must answer within ``seconds`` from now."""
    token = _ANSWER_BY.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _ANSWER_BY.reset(token)


def reconcile_deadline(settings: Settings) -> tuple[float, bool]:
    """When a reconciliation that cannot reach its downstream stops asking here: after
    ``reconcile_patience_s``, or sooner in an approval's request; and whether it is that
    request's bound (not the patience) that ends it."""
    deadline = time.monotonic() + settings.reconcile_patience_s
    answer_by = _ANSWER_BY.get()
    if answer_by is None or answer_by >= deadline:
        return deadline, False
    return answer_by, True


def give_up(key: str, tool_call_id: str, tool: str, *, bounded: bool) -> None:
    """A reconciliation past its deadline: when the deadline was an approval request's
    bound, hand the run over (``HandOver``) rather than decide it cannot be told; when the
    whole patience ran out, return (the run fails ``unreconcilable``). Never while a
    call under ``key`` overran its timeout and still runs in this process: a reaper
    elsewhere would not know it may yet take effect, and might run the write again."""
    if bounded and not still_running(key):
        raise HandOver(tool_call_id, tool)
