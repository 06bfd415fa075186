"""Settling a COMMIT whose answer was lost, on PostgreSQL: ``txid_status()`` of the
transaction's id tells whether it committed, at once, instead of a heartbeat timeout and
a recovery attempt (docs/operations.md, "Settled at once: a worker's claim").

The id comes back with the write itself (``txid_current()`` in its RETURNING: a write has
an id anyway, so it costs no round trip; a ``SELECT txid_current()`` of its own would
cost one more per transaction: benchmarks/README.md, db_work.py). The question goes on
another connection: the one the COMMIT was cut off on is gone. The server may still be
finishing that COMMIT when the question comes (``in progress``), so it is asked again,
for a bounded time.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

# How long an ``in progress`` answer is asked again before the fate is called unknown.
PATIENCE_S = 2.0
_STATUS = sa.text("SELECT txid_status(:xid)")


def transaction_fate(engine: Engine, xid: int) -> str | None:
    """``committed``, ``aborted``, or None when the server cannot tell (it is unreachable,
    the id is too old, or the transaction is still in progress after ``PATIENCE_S``)."""
    deadline = time.monotonic() + PATIENCE_S
    delay = 0.01
    while True:
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                status = conn.execute(_STATUS, {"xid": xid}).scalar()
        except sa.exc.DBAPIError:
            return None
        if status in ("committed", "aborted"):
            return str(status)
        if status != "in progress" or time.monotonic() + delay > deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
