"""A schedule's tick with real processes (reference §13, §7): a ``tether worker`` killed
between the tick's claim and its run's INSERT (``after_tick_claim``) leaves neither (they
are one transaction), and the next worker fires the tick: exactly one run, once."""

from __future__ import annotations

from pathlib import Path

import inprocess
import processes
import sqlalchemy as sa
from waiting import run_sync

from tether.runs import RunState
from tether.store import Store
from tether.store.sql.schema import runs, schedules

worker = processes.worker_until_idle


def test_a_worker_killed_between_a_ticks_claim_and_its_run_leaves_the_tick_to_the_next(
    db_url: str, tmp_path: Path
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    # yearly: once fired, the next tick cannot come due while the three workers run
    added = run_sync(engine.add_schedule("dana", "0 0 1 1 *", "the report"))
    engine.close()
    store = Store(db_url)
    try:
        due = store.now() - 1.0
        with store.begin() as conn:  # due now, as if its time had come
            conn.execute(schedules.update().values(next_at=due))

        def ticks() -> tuple[list[str], tuple[float, int]]:
            with store.engine.connect() as conn:
                ids = conn.execute(sa.select(runs.c.id).where(runs.c.schedule_id == added.id))
                row = conn.execute(sa.select(schedules.c.next_at, schedules.c.fired)).one()
                return list(ids.scalars()), (row.next_at, row.fired)

        code = worker(db_url, tmp_path / "w1.log", TETHER_FAILPOINTS="after_tick_claim=crash")
        assert code == 137, (tmp_path / "w1.log").read_text()
        assert ticks() == ([], (due, 0))  # the claim died with its transaction: still due
        assert worker(db_url, tmp_path / "w2.log") == 0, (tmp_path / "w2.log").read_text()
        fired, (next_at, count) = ticks()
        assert len(fired) == 1 and count == 1 and next_at > due
        run = store.get_run(fired[0])
        assert run is not None and run.state is RunState.ANSWERED and run.user_id == "dana"
        assert worker(db_url, tmp_path / "w3.log") == 0  # not due again: nothing more
        assert ticks()[0] == fired
    finally:
        store.close()
