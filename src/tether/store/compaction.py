"""Compactions (reference §14): the summaries a model sees in place of the messages they
cover, one row each, and the fenced write that stores one.

The messages themselves are never rewritten (invariant 1): a compaction is a row that says
"the first ``through_seq`` messages of this thread's conversation reach the model as this
summary". The store keeps the rows and the counters; the view the model is handed is the
runtime's (``tether._runtime.step.compaction``), which knows the chat format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.errors import LeaseLost
from tether.runs import Lease, Run
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import compactions, runs
from tether.store.sql.steps import LEASE, add_event, lease_params


@dataclass(frozen=True, kw_only=True)
class CompactionRecord:
    """A stored compaction: the 1-based position, in its thread's conversation, of the last
    message its summary covers, the summary, and the run that made it."""

    run_id: str
    through_seq: int
    summary: str
    summary_tokens: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> CompactionRecord:
        return cls(
            run_id=row["run_id"],
            through_seq=row["through_seq"],
            summary=row["summary"],
            summary_tokens=row["summary_tokens"],
        )


# The summary's spend, the active time, and the trigger spent (the next model call's
# report sets it again), on the run the lease holds.
_COMPACT = (
    runs.update()
    .where(LEASE)
    .values(
        spend_usd=runs.c.spend_usd + sa.bindparam("b_spend", type_=sa.Float),
        elapsed_ms=runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
        last_input_tokens=0,
    )
    .returning(runs.c.id)
)
_INSERT = compactions.insert().values(created_at=db_now())
# The latest compaction of a thread made by a run at or before place ``b_pos``: later runs'
# compactions cover messages the run does not see.
_LATEST = (
    sa.select(compactions)
    .select_from(compactions.join(runs, runs.c.id == compactions.c.run_id))
    .where(
        compactions.c.thread_id == sa.bindparam("b_thread"),
        runs.c.thread_pos <= sa.bindparam("b_pos"),
    )
    .order_by(compactions.c.id.desc())
    .limit(1)
)
# What the latest model call of the thread's earlier runs reported (a run with no call and
# no compaction of its own has NULL and is passed over).
_EARLIER_INPUT = (
    sa.select(runs.c.last_input_tokens)
    .where(
        runs.c.thread_id == sa.bindparam("b_thread"),
        runs.c.thread_pos < sa.bindparam("b_pos"),
        runs.c.last_input_tokens.is_not(None),
    )
    .order_by(runs.c.thread_pos.desc())
    .limit(1)
)


def compaction_state(
    conn: Connection, run: Run, own_input_tokens: int | None
) -> tuple[CompactionRecord | None, int]:
    """The compaction ``run`` is handed its conversation through (its thread's latest, as
    of its place), and the input tokens the conversation's latest model call reported (0
    once compacted after it): the run's own, else its thread's earlier runs'. Read in the
    caller's transaction, with the run's messages."""
    params = {"b_thread": run.thread_id, "b_pos": run.thread_pos}
    row = conn.execute(_LATEST, params).first()
    latest = CompactionRecord.from_row(row._mapping) if row is not None else None
    tokens = own_input_tokens
    if tokens is None and run.thread_pos > 1:
        tokens = conn.execute(_EARLIER_INPUT, params).scalar()
    return latest, int(tokens or 0)


class Compaction(StoreBase):
    """Storing a compaction."""

    def compact(
        self,
        lease: Lease,
        *,
        thread_id: str,
        through_seq: int,
        summary: str,
        summary_tokens: int,
        spend_usd: float,
        elapsed_ms: int,
        event: dict[str, Any],
    ) -> None:
        """The compaction row, the summary's spend (not a step: steps count the
        conversation's model turns), the active time and the trigger spent, with a
        ``compacted`` event, in one transaction fenced by the lease (``LeaseLost``, nothing
        written, when another owner took the run). Not tried again after a COMMIT that
        was cut off: the next owner finds either the compaction stored or the trigger
        still set, and compacts again only in the second case."""
        params = {
            **lease_params(lease),
            "b_spend": spend_usd,
            "b_elapsed": elapsed_ms,
        }
        with self.begin() as conn:
            if conn.execute(_COMPACT, params).first() is None:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            conn.execute(
                _INSERT,
                {
                    "thread_id": thread_id,
                    "run_id": lease.run_id,
                    "through_seq": through_seq,
                    "summary": summary,
                    "summary_tokens": summary_tokens,
                },
            )
            add_event(conn, lease.run_id, "compacted", event)
