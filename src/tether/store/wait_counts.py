"""Why runs wait (reference §13), counted fleet-wide for ``/metrics``: queued on their
thread, queued until their start time, and ready but held back by their user's cap
(``TETHER_MAX_ACTIVE_PER_USER``). Each count reads its partial index or ``user_load``,
never the finished runs."""

from __future__ import annotations

import sqlalchemy as sa

from tether.runs import RunState
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import runs, user_load
from tether.store.sql.transitions import state_in

_QUEUED = state_in([RunState.QUEUED])
_LATER = sa.and_(runs.c.start_at.is_not(None), runs.c.start_at > db_now())
_BY_START = sa.select(sa.func.count()).where(_QUEUED, _LATER)
_BY_THREAD = sa.select(sa.func.count()).where(_QUEUED, ~_LATER)
# The earliest start time still ahead, by the ``runs_starting`` index's first row.
_NEXT_START = sa.select(sa.func.min(runs.c.start_at) - db_now()).where(_QUEUED, _LATER)
_BY_CAP = sa.select(sa.func.coalesce(sa.func.sum(user_load.c.ready), 0)).where(
    user_load.c.ready > 0, user_load.c.carried >= sa.bindparam("b_cap", type_=sa.Integer)
)


class WaitCounts(StoreBase):
    """Counting the runs that wait, by why."""

    def count_waiting(self, cap: int | None) -> dict[str, int]:
        """How many runs wait on their thread, on their start time (by the database's
        clock) and, with ``cap``, on their user's cap (ready runs of users carrying
        ``cap``): ``{"thread", "start_time", "user_cap"}``."""
        with self.engine.connect() as conn:
            counts = {
                "thread": int(conn.execute(_BY_THREAD).scalar_one()),
                "start_time": int(conn.execute(_BY_START).scalar_one()),
                "user_cap": 0,
            }
            if cap is not None:
                counts["user_cap"] = int(conn.execute(_BY_CAP, {"b_cap": cap}).scalar_one())
        return counts

    def next_start_in(self) -> float | None:
        """Seconds until the earliest start time of a queued run that is still ahead, by
        the database's clock; None when no run waits for one."""
        with self.engine.connect() as conn:
            due = conn.execute(_NEXT_START).scalar()
        return None if due is None else max(0.0, float(due))
