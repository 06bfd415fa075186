"""The statements of the step path and the fenced transitions, built once at import.

Each is executed with bound parameters (``b_*``). Every write to a running run is
conditional on its lease (``owner`` and ``lease_epoch``): a write whose lease was lost
matches no row, the caller raises ``LeaseLost`` and the transaction rolls back, so a
fenced-out worker leaves nothing behind (invariant 8).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.runs import Lease, RunState
from tether.store.backend.announce import mark
from tether.store.backend.clock import db_now
from tether.store.records import CallStatus
from tether.store.sql.schema import run_events, run_messages, runs, tool_calls
from tether.store.sql.sealed import SealedJSON
from tether.store.sql.transitions import Transition, state_in

RUNNING = RunState.RUNNING

# The lease, without the state (a Transition names the state it expects).
OWNS = sa.and_(
    runs.c.id == sa.bindparam("b_id"),
    runs.c.owner == sa.bindparam("b_owner"),
    runs.c.lease_epoch == sa.bindparam("b_epoch"),
)
# The lease of a running run: the condition of every step write that keeps the state.
LEASE = sa.and_(OWNS, state_in([RUNNING]))

# A step refreshes the heartbeat only when it is older than ``b_fresh`` seconds, and does
# not touch ``updated_at`` (a state change does): no indexed column changes on a routine
# step, so PostgreSQL can update the row in place (HOT) instead of rewriting every index.
_FRESH_HEARTBEAT = sa.case(
    (
        runs.c.heartbeat_at < db_now() - sa.bindparam("b_fresh", type_=sa.Float),
        db_now(),
    ),
    else_=runs.c.heartbeat_at,
)

# A step write also compares the stored message count with the one its writer holds
# (``b_seq``: the seq of its first message). A write is thus applied at most once: tried
# again after its COMMIT was cut off, it matches no row if the first attempt landed, and
# the store finds its own message at ``b_seq`` (``Steps._landed``).
AT_SEQ = runs.c.message_count == sa.bindparam("b_seq", type_=sa.Integer)

_TURN_VALUES: dict[str, Any] = {
    "step": runs.c.step + 1,
    "steps": runs.c.steps + 1,
    "spend_usd": runs.c.spend_usd + sa.bindparam("b_spend", type_=sa.Float),
    "elapsed_ms": runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
    # A read-only step stores its calls' results with its turn (``b_added`` messages).
    "tool_calls": runs.c.tool_calls + sa.bindparam("b_counted", type_=sa.Integer),
    "message_count": runs.c.message_count + sa.bindparam("b_added", type_=sa.Integer),
    "heartbeat_at": _FRESH_HEARTBEAT,
    # A stored turn is a model call that succeeded: the count of consecutive failed ones
    # starts again (reference §10). A constant in an UPDATE that happens anyway costs nothing.
    "model_failures": sa.literal_column("0"),
    # What the call reported: over the agent's threshold, the next call is compacted first.
    "last_input_tokens": sa.bindparam("b_input", type_=sa.Integer),
}

# The assistant turn's counters; RETURNING the new message count.
TURN = runs.update().where(LEASE, AT_SEQ).values(**_TURN_VALUES).returning(runs.c.message_count)

# A final answer: the same counters, running → answered, and the validated typed output
# (SQL NULL, not JSON null, when there is none).
TURN_FINAL = Transition(
    RUNNING,
    RunState.ANSWERED,
    OWNS,
    AT_SEQ,
    returning=(runs.c.message_count,),
    **_TURN_VALUES,
    owner=None,
    updated_at=db_now(),
    output=sa.bindparam("b_output", type_=SealedJSON(none_as_null=True)),
)

RESULT = (
    runs.update()
    .where(LEASE, AT_SEQ)
    .values(
        tool_calls=runs.c.tool_calls + sa.bindparam("b_counted", type_=sa.Integer),
        elapsed_ms=runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
        message_count=runs.c.message_count + 1,
        heartbeat_at=_FRESH_HEARTBEAT,
    )
    .returning(runs.c.message_count)
)

# A follow-up's first messages (reference §14): the ``not_executed`` results it adds and its
# question, written once by the owner that started it, at message count 0.
OPENING = (
    runs.update()
    .where(LEASE, AT_SEQ)
    .values(
        message_count=runs.c.message_count + sa.bindparam("b_added", type_=sa.Integer),
        heartbeat_at=_FRESH_HEARTBEAT,
    )
    .returning(runs.c.message_count)
)

HEARTBEAT = runs.update().where(LEASE).values(heartbeat_at=db_now())
# Many leases' heartbeats in one statement (``b_ids`` their runs, for the primary key;
# ``b_leases`` each (run, owner, epoch)); the leases it refreshed come back.
HEARTBEATS = (
    runs.update()
    .where(
        runs.c.id.in_(sa.bindparam("b_ids", expanding=True)),
        sa.tuple_(runs.c.id, runs.c.owner, runs.c.lease_epoch).in_(
            sa.bindparam("b_leases", expanding=True)
        ),
        state_in([RUNNING]),
    )
    .values(heartbeat_at=db_now())
    .returning(runs.c.id, runs.c.owner, runs.c.lease_epoch)
)

# Letting go of a run for the reapers to recover, without a state change: the owner stays,
# its heartbeat is made stale at once (the oldest there can be), the active time is added.
HAND_OVER = (
    runs.update()
    .where(LEASE)
    .values(
        heartbeat_at=sa.literal(0.0, type_=sa.Float),
        elapsed_ms=runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
    )
)

LEASE_HELD = sa.select(runs.c.id).where(LEASE)

REFRESH_SCOPE = (
    runs.update()
    .where(LEASE)
    .values(scope_snapshot=sa.bindparam("b_scope", type_=sa.JSON), scope_resolved_at=db_now())
)

_DELAY = sa.bindparam("b_delay", type_=sa.Float)

# Leaving running under the lease: each sets the new state, clears the owner and adds the
# active time since the last write.
_LEAVE: dict[str, Any] = {
    "owner": None,
    "elapsed_ms": runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
    "updated_at": db_now(),
}

HALT = Transition(
    RUNNING,
    RunState.HALTED,
    OWNS,
    returning=(runs.c.id,),
    **_LEAVE,
    halt_reason=sa.bindparam("b_reason"),
    halted_by=sa.bindparam("b_halted_by", type_=sa.String),
    # A model call whose step a tree refused still cost what it cost (reference §18).
    spend_usd=runs.c.spend_usd + sa.bindparam("b_spend", type_=sa.Float),
)

FAIL = Transition(
    RUNNING,
    RunState.FAILED,
    OWNS,
    returning=(runs.c.id,),
    **_LEAVE,
    fail_reason=sa.bindparam("b_reason"),
)

SUSPEND = Transition(
    RUNNING,
    RunState.SUSPENDED,
    OWNS,
    returning=(runs.c.expires_at,),
    **_LEAVE,
    pending=sa.bindparam("b_pending", type_=SealedJSON),
    pending_token_hash=sa.bindparam("b_token_hash"),
    undecided=sa.bindparam("b_undecided", type_=sa.Integer),
    suspended_at=db_now(),
    expires_at=db_now() + sa.bindparam("b_ttl", type_=sa.Float),
    notified_at=None,
)

# Handed back to the workers (still running, no owner), claimable at once or after a delay.
RELEASE = Transition(
    RUNNING,
    RUNNING,
    OWNS,
    returning=(runs.c.id,),
    **_LEAVE,
    ready_at=sa.case((_DELAY > 0, db_now() + _DELAY), else_=sa.null()),
)

# Handed back after a model call that failed transiently: claimable after the backoff,
# with one more consecutive failure counted; RETURNING the count and when it may run.
MODEL_RETRY = Transition(
    RUNNING,
    RUNNING,
    OWNS,
    returning=(runs.c.model_failures, runs.c.ready_at),
    **_LEAVE,
    ready_at=db_now() + _DELAY,
    model_failures=runs.c.model_failures + 1,
)

INSERT_MESSAGE = run_messages.insert()

INSERT_EVENT = run_events.insert().values(at=db_now())
# The run's row, to lock before an event that no update of the run comes with: events of a
# run are written under its row lock, so they commit in id order (their SEQ, reference §11).
RUN_ROW = sa.select(runs.c.id).where(runs.c.id == sa.bindparam("b_id"))

INSERT_INTENT = tool_calls.insert().values(status=CallStatus.INTENT.value, intent_at=db_now())

# A ledger entry whose outcome is known when it is written (a read-only step's calls).
INSERT_DONE = tool_calls.insert().values(intent_at=db_now(), outcome_at=db_now())

# The statuses an outcome may replace, inlined (no expanding IN: the statement is also
# compiled once for SQLite's driver cursor, ``backend/sqlite.py``).
_OPEN: list[sa.ColumnElement[str]] = [
    sa.literal_column(f"'{s.value}'") for s in (CallStatus.INTENT, CallStatus.UNKNOWN)
]

RECORD_EDIT = (
    tool_calls.update()
    .where(tool_calls.c.idempotency_key == sa.bindparam("b_key"))
    .values(edited_arguments=sa.bindparam("b_args", type_=SealedJSON))
)

RECORD_OUTCOME = (
    tool_calls.update()
    .where(
        tool_calls.c.idempotency_key == sa.bindparam("b_key"),
        tool_calls.c.status.in_(_OPEN),
    )
    .values(
        status=sa.bindparam("b_status"),
        result=sa.bindparam("b_result", type_=SealedJSON),
        outcome_at=db_now(),
    )
)

# The message at ``b_seq`` while ``b_owner``/``b_epoch`` still hold the run, or after the
# run answered (a final turn clears the owner): how a step write tried again learns that
# its first attempt landed.
LANDED = (
    sa.select(run_messages.c.message)
    .select_from(run_messages.join(runs, runs.c.id == run_messages.c.run_id))
    .where(
        run_messages.c.run_id == sa.bindparam("b_id"),
        run_messages.c.seq == sa.bindparam("b_seq"),
        sa.or_(
            sa.and_(OWNS, state_in([RUNNING])),
            state_in([RunState.ANSWERED]),
        ),
    )
)

SELECT_MESSAGES = (
    sa.select(run_messages.c.message)
    .where(run_messages.c.run_id == sa.bindparam("b_id"))
    .order_by(run_messages.c.seq)
)


def lease_params(lease: Lease) -> dict[str, Any]:
    """The bound parameters of ``OWNS`` / ``LEASE``."""
    return {"b_id": lease.run_id, "b_owner": lease.owner, "b_epoch": lease.epoch}


def add_event(conn: Connection, run_id: str, kind: str, data: dict[str, Any]) -> None:
    """Append one entry to the run's trace, in the caller's transaction."""
    conn.execute(INSERT_EVENT, {"run_id": run_id, "kind": kind, "data": data})
    mark(conn, run_id)
