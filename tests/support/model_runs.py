"""Carrying a run in process while its model fails and the run is handed back with a
backoff (reference §10, §21), and reading what it stored: for the outage and fallback
tests (``tests/integration/test_model_outage.py``, ``test_fallback.py``)."""

from __future__ import annotations

from waiting import until

from tether import Engine, StopKind
from tether.results import LiveEvent, Outcome
from tether.runs import Run

DEADLINE_S = 30.0


async def until_stopped(engine: Engine, run_id: str) -> Outcome:
    """Claim and carry the run each time it is claimable again, until it stops for good
    (not handed back); fails after the deadline."""

    async def stopped() -> Outcome | None:
        outcome = await engine.run_until_stop(run_id)  # claimable again after its backoff
        return None if outcome.kind is StopKind.RELEASED else outcome

    return await until(stopped, timeout=DEADLINE_S, interval=0.01, what=f"run {run_id} to stop")


def stored(engine: Engine, run_id: str) -> Run:
    """The run as stored."""
    run = engine.runner.store.get_run(run_id)
    assert run is not None
    return run


async def of_kind(engine: Engine, run_id: str, kind: str) -> list[LiveEvent]:
    """The run's events of ``kind``, in order."""
    return [e for e in await engine.events(run_id) if e.kind == kind]
