"""Where a run stopped, as the loop and the resumptions return it (never raised)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pydantic import BaseModel

from tether.notify import Notice
from tether.runs import RunState


class StopKind(str, enum.Enum):
    """Why the loop returned."""

    ANSWERED = "answered"
    SUSPENDED = "suspended"
    HALTED = "halted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RELEASED = "released"  # handed back to the workers, still running
    LEASE_LOST = "lease_lost"  # another owner took the run; this one wrote nothing more
    # The database could not be reached: this process let go of the run without writing
    # more, and it is recovered as an orphan (or its write retried) once the database is back.
    ABANDONED = "abandoned"

    @property
    def state(self) -> RunState | None:
        """The run's state after this stop; None when this process cannot tell (lost)."""
        return _STATE_OF.get(self)

    @classmethod
    def of(cls, state: RunState) -> StopKind:
        """The stop a stored state shows (a running run is waiting for a worker)."""
        return _KIND_OF[state]


# The one map between stops and states, both ways.
_STATE_OF = {
    StopKind.ANSWERED: RunState.ANSWERED,
    StopKind.SUSPENDED: RunState.SUSPENDED,
    StopKind.HALTED: RunState.HALTED,
    StopKind.FAILED: RunState.FAILED,
    StopKind.CANCELLED: RunState.CANCELLED,
    StopKind.RELEASED: RunState.RUNNING,
}
_KIND_OF = {state: kind for kind, state in _STATE_OF.items()}


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """Where a run stopped: the kind, the halt or fail reason, the suspension's notice,
    the model's final answer when it answered, and, for a run handed back with a delay (a
    backoff), in how many seconds it may be claimed again."""

    run_id: str
    kind: StopKind
    reason: str | None = None
    notice: Notice | None = None
    answer: str | None = None
    retry_in_s: float | None = None
    # The answer validated against the agent's ``output_type``: an instance of it (narrow
    # with ``isinstance``); None without one, or when this call did not carry the run to
    # its answer (``RunView.output`` holds the stored JSON of any answered run; SPEC §11).
    output: BaseModel | None = None

    @property
    def state(self) -> RunState | None:
        return self.kind.state
