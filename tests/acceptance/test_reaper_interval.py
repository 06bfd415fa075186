"""``TETHER_REAPER_INTERVAL_S=1`` is honoured on both backends, with real processes
(tests/support/reaping.py): a worker with a one-second interval recovers every orphan once
and re-issues a refused notice at each of its passes, five of them, where the default
interval (60 s) gives one pass within the test's two-minute wait.

What is asserted is what the passes did, never how far apart they were: a loaded machine
stretches the spacing, so ``benchmarks/reaper_interval.py`` measures it (against the 5 s
idle wait the PostgreSQL worker used to fall back to) and prints its figures.
"""

from __future__ import annotations

from pathlib import Path

import reaping


def test_a_one_second_reaper_interval_is_honoured(db_url: str, tmp_path: Path) -> None:
    reaped = reaping.reap_with_a_one_second_interval(db_url, tmp_path / "reaper.log")
    assert len(reaped.recoveries) == reaping.ORPHANS  # one pass each, none recovered twice
    assert len(reaped.reissues) >= reaping.REISSUES  # one re-issue a pass of the notices task
    # Each re-issue was really sent and refused (SIGTERM may cut the last one short).
    assert reaped.posts >= reaping.REISSUES - 1
    assert len(reaped.records) == len(set(reaped.records)) == reaping.ORPHANS  # applied once
    assert reaped.suspended_state == "suspended"
