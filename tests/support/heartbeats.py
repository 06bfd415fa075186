"""Whether a run's owner's heartbeat is stale by the database's clock: what tests wait for
after an owner "dies" (a killed process, a stopped heartbeat, a connection cut off),
before a reaper may take the run. Through a store, or through an engine's public reads."""

from __future__ import annotations

import sqlalchemy as sa

from tether import Engine
from tether.store import Store

# A little more than the subprocesses' heartbeat timeout (``processes.tether_env``: 0.3 s).
AFTER_S = 0.35


def stale(
    store: Store,
    run_id: str,
    after_s: float = AFTER_S,
    *,
    unowned: bool = False,
    reconnects: bool = False,
) -> bool:
    """The run's heartbeat is older than ``after_s``; ``unowned``: a run nobody owns (its
    owner let it go) counts as stale too. ``reconnects``: a read that meets a pooled
    connection killed while idle answers False (the pool reconnects on the next poll)."""
    try:
        run = store.get_run(run_id)
    except sa.exc.OperationalError as exc:
        if not reconnects:
            raise
        # A direct store call (no ``hop``, so no retry) on a pooled connection that was
        # killed while idle: the pool reconnects on the next poll.
        assert exc.connection_invalidated
        return False
    assert run is not None
    if unowned and run.owner is None:
        return True
    return store.now() - (run.heartbeat_at or 0) > after_s


async def owner_stale(engine: Engine, run_id: str, after_s: float) -> bool:
    """The run has an owner whose heartbeat is older than ``after_s``, read through the
    engine's public reads."""
    run = (await engine.get_run(run_id)).run
    assert run is not None and run.owner is not None
    return await engine.now() - (run.heartbeat_at or 0) > after_s
