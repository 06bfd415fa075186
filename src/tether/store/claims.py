"""Creating runs and the owner changes that are not a running owner's own writes: claims
of ready runs, suspensions and orphans, continuing a halted run, cancelling.

Every state change here is a ``Transition`` (one conditional UPDATE checked against the
table), so two claimers racing for one run cannot both win: the loser's UPDATE matches
no row and it is told so (None). On PostgreSQL the claims of suspensions and orphans are
one statement each (``pg_claims``), built here from the same transitions.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.budget import Limits
from tether.models.base import Message
from tether.runs import FailReason, Run, RunState, can_transition
from tether.store import pg_claims
from tether.store.announce import mark
from tether.store.base import StoreBase
from tether.store.clock import db_now
from tether.store.records import Decision
from tether.store.schema import decisions, runs
from tether.store.served import SERVED, served
from tether.store.statements import INSERT_MESSAGE, add_event
from tether.store.transitions import Transition, state_in

RUNNING = RunState.RUNNING
_ID = runs.c.id == sa.bindparam("b_id")
_CLAIMED: dict[str, Any] = {
    "owner": sa.bindparam("b_owner"),
    "lease_epoch": runs.c.lease_epoch + 1,
    "heartbeat_at": db_now(),
    "updated_at": db_now(),
    "ready_at": None,
}

# Waiting for a worker: running, no owner (the ready-runs partial index's predicate, so
# the index serves the pick), and not held back by a delay, judged by the DB clock.
_NOT_DELAYED = sa.or_(runs.c.ready_at.is_(None), runs.c.ready_at <= db_now())
_READY_CANDIDATE = (
    sa.select(runs.c.id)
    .where(state_in([RUNNING]), runs.c.owner.is_(None), _NOT_DELAYED, SERVED)
    .order_by(runs.c.updated_at)
    .limit(1)
)
_CLAIM_READY = Transition(
    RUNNING, RUNNING, _ID, runs.c.owner.is_(None), _NOT_DELAYED, SERVED, **_CLAIMED
)

_TOKEN = runs.c.pending_token_hash == sa.bindparam("b_token_hash")
_CLAIM_SUSPENDED = Transition(
    RunState.SUSPENDED, RUNNING, _ID, _TOKEN, runs.c.expires_at > db_now(), SERVED, **_CLAIMED
)
_PG_CLAIM_SUSPENDED = pg_claims.suspended_statement(_CLAIM_SUSPENDED.statement)
_DECISION_OF_TOKEN = sa.select(decisions).where(
    decisions.c.token_hash == sa.bindparam("b_token_hash")
)

# No pass start to stay before: the largest float (finite, so it renders in any plan).
_NO_CUTOFF = sys.float_info.max
# An orphan: running under an owner whose heartbeat is older than ``b_stale`` seconds,
# and older than ``b_before`` (the start of the reaper's pass: a run it claimed has a
# fresh heartbeat, so one pass never takes a run twice). The claim re-checks both, so a
# run whose owner came back (or that another reaper took) meanwhile is left alone.
_STALE = sa.and_(
    runs.c.owner.is_not(None),
    runs.c.heartbeat_at < db_now() - sa.bindparam("b_stale", type_=sa.Float),
    runs.c.heartbeat_at < sa.bindparam("b_before", value=_NO_CUTOFF, type_=sa.Float),
    SERVED,
)
_ORPHANS = (
    sa.select(runs.c.id)
    .where(state_in([RUNNING]), _STALE)
    .order_by(runs.c.heartbeat_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
_WITHIN = runs.c.recovery_attempts < sa.bindparam("b_max")
_PAST = runs.c.recovery_attempts >= sa.bindparam("b_max")
_RECOVERED: dict[str, Any] = {**_CLAIMED, "recovery_attempts": runs.c.recovery_attempts + 1}
_EXHAUSTED: dict[str, Any] = {
    "returning": (runs.c.id, runs.c.recovery_attempts),
    "fail_reason": FailReason.RECOVERY_EXHAUSTED.value,
    "owner": None,
    "updated_at": db_now(),
}
_RECOVER = Transition(RUNNING, RUNNING, _ID, _STALE, _WITHIN, **_RECOVERED)
_EXHAUST = Transition(RUNNING, RunState.FAILED, _ID, _STALE, _PAST, **_EXHAUSTED)
# PostgreSQL: the same two transitions over a whole batch of locked candidates at once.
_LOCKED = _ORPHANS.with_for_update(skip_locked=True).cte("c")
_IN_BATCH = runs.c.id == _LOCKED.c.id
_PG_CLAIM_ORPHANS = pg_claims.orphans_statement(
    Transition(RUNNING, RUNNING, _IN_BATCH, _STALE, _WITHIN, **_RECOVERED).statement,
    Transition(RUNNING, RunState.FAILED, _IN_BATCH, _STALE, _PAST, **_EXHAUSTED).statement,
)
_CENSUS = sa.select(db_now(), sa.select(runs.c.id).where(state_in([RUNNING]), _STALE).exists())


@dataclass(frozen=True, kw_only=True)
class SuspensionClaim:
    """What a claim of a suspension found: the run it claimed with the decision it
    recorded, or (``run`` None) the decision that had already used the token; neither
    when the token is unknown, expired or superseded."""

    run: Run | None = None
    decision: Decision | None = None


_LIMITS = ("max_steps", "max_spend_usd", "max_tool_calls", "max_elapsed_ms")
_GRANTED: dict[str, Any] = {name: sa.bindparam(f"b_{name}") for name in _LIMITS}
_HALTED_OF_USER = sa.select(runs).where(
    _ID, runs.c.user_id == sa.bindparam("b_user"), state_in([RunState.HALTED])
)
_CONTINUE = Transition(
    RunState.HALTED,
    RUNNING,
    _ID,
    runs.c.user_id == sa.bindparam("b_user"),
    owner=None,
    halt_reason=None,
    pending=None,
    ready_at=None,
    updated_at=db_now(),
    **_GRANTED,
)

# Any state the table lets the owner cancel from (every state that is not terminal).
_CANCEL = Transition(
    [state for state in RunState if can_transition(state, RunState.CANCELLED)],
    RunState.CANCELLED,
    _ID,
    runs.c.user_id == sa.bindparam("b_user"),
    owner=None,
    ready_at=None,
    updated_at=db_now(),
)


class Claims(StoreBase):
    """Creating runs, claiming them, continuing and cancelling them."""

    def create_run(
        self,
        *,
        run_id: str,
        user_id: str,
        question: str,
        route: dict[str, Any],
        limits: Limits,
        scope: dict[str, Any],
        versions: dict[str, Any],
        agent_version: str,
        messages: Sequence[Message],
        trace_context: dict[str, str] | None = None,
    ) -> Run:
        """Insert a new run, ready for a worker (running, no owner), with its first
        messages and the W3C trace context its spans continue (``tracing.py``)."""
        with self.begin() as conn:
            row = conn.execute(
                runs.insert()
                .values(
                    id=run_id,
                    user_id=user_id,
                    question=question,
                    route=route,
                    state=RUNNING.value,
                    **limits.to_json(),
                    scope_snapshot=scope,
                    scope_resolved_at=db_now(),
                    versions=versions,
                    agent_version=agent_version,
                    message_count=len(messages),
                    trace_context=trace_context,
                    started_at=db_now(),
                    updated_at=db_now(),
                )
                .returning(runs)
            ).one()
            if messages:
                conn.execute(
                    INSERT_MESSAGE,
                    [{"run_id": run_id, "seq": i, "message": m} for i, m in enumerate(messages)],
                )
            add_event(conn, run_id, "created", {"user_id": user_id, "limits": limits.to_json()})
            self.dialect.wake(conn)
            return Run.from_row(row._mapping)

    def claim_ready(
        self, owner: str, run_id: str | None = None, *, versions: Sequence[str] | None = None
    ) -> Run | None:
        """Take the lease of a run of ``versions`` (None: any) that waits for a worker
        (running, no owner, not delayed past the database's clock): the given one, or the
        one waiting longest. None if there is none to take.

        Safe to race: the claim is conditional on ``owner IS NULL``, and the dialect locks
        the candidate (SKIP LOCKED on PostgreSQL) so concurrent workers pick different runs.
        """
        which = served(versions)
        with self.begin() as conn:
            if run_id is None:
                run_id = conn.execute(self.dialect.candidates(_READY_CANDIDATE), which).scalar()
                if run_id is None:
                    return None
            row = _CLAIM_READY.one(conn, {"b_id": run_id, "b_owner": owner, **which})
            return Run.from_row(row._mapping) if row else None

    def claim_suspended(
        self, *, run_id: str, token_hash: str, owner: str, decision: str, approver: str
    ) -> Run | None:
        """The run claimed by ``claim_decision`` (of any version), or None if the claim lost."""
        return self.claim_decision(
            run_id=run_id, token_hash=token_hash, owner=owner, decision=decision, approver=approver
        ).run

    def claim_decision(
        self,
        *,
        run_id: str,
        token_hash: str,
        owner: str,
        decision: str,
        approver: str,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        digest: str | None = None,
        event: dict[str, Any] | None = None,
        versions: Sequence[str] | None = None,
    ) -> SuspensionClaim:
        """The one claim of a suspension (invariant 5): suspended → running under
        ``owner``, conditional on the token and on ``expires_at`` against the database's
        clock, recording the decision (who, when, the approver's ``reason``, the
        ``arguments`` the call is to run with when they are not the model's, and the
        ``digest`` the approver saw, by default the pending preview's) and its
        ``approved`` / ``declined`` event (``event``: its data) in the same transaction.
        A claim that lost reads, in the same transaction, the decision that used the token
        (a new statement sees what the winner committed while this UPDATE waited on its
        lock), so a loser is answered without another trip to the store. Only a run of
        ``versions`` (None: any) is claimed; the caller tells a run of another version
        apart (``wrong_version``)."""
        params = {
            **served(versions),
            "b_id": run_id,
            "b_token_hash": token_hash,
            "b_owner": owner,
            "b_decision": decision,
            "b_approver": approver,
            "b_reason": reason,
            "b_arguments": arguments,
            "b_digest": digest,
            "b_kind": "declined" if decision == "decline" else "approved",
            "b_event": {"decision": decision, "by": approver, **(event or {})},
        }
        with self.begin() as conn:
            if self.dialect.one_statement_claims:
                won = conn.execute(_PG_CLAIM_SUSPENDED, params).first()
                if won is not None:
                    mark(conn, won.id)  # its approved / declined event
                    mapping = won._mapping
                    recorded = {c.name: mapping[f"d_{c.name}"] for c in decisions.c}
                    return SuspensionClaim(
                        run=Run.from_row(mapping), decision=Decision.from_row(recorded)
                    )
            else:
                claim = self._claim_suspension(conn, params)
                if claim is not None:
                    return claim
            used = conn.execute(_DECISION_OF_TOKEN, params).first()
            return SuspensionClaim(decision=Decision.from_row(used._mapping) if used else None)

    @staticmethod
    def _claim_suspension(conn: Connection, params: dict[str, Any]) -> SuspensionClaim | None:
        """The claim as a statement sequence (SQLite)."""
        row = _CLAIM_SUSPENDED.one(conn, params)
        if row is None:
            return None
        run = Run.from_row(row._mapping)
        assert run.pending is not None
        recorded = conn.execute(
            decisions.insert()
            .values(
                token_hash=params["b_token_hash"],
                run_id=run.id,
                tool_call_id=run.pending.tool_call_id,
                decision=params["b_decision"],
                decided_by=params["b_approver"],
                decided_at=db_now(),
                digest=params["b_digest"] or run.pending.digest,
                reason=params["b_reason"],
                arguments=params["b_arguments"],
            )
            .returning(*decisions.c)
        ).one()
        data = {**params["b_event"], "tool_call_id": run.pending.tool_call_id}
        add_event(conn, run.id, params["b_kind"], data)
        return SuspensionClaim(run=run, decision=Decision.from_row(recorded._mapping))

    def orphan_census(
        self, *, stale_after_s: float, versions: Sequence[str] | None = None
    ) -> tuple[float, bool]:
        """The database's clock now, and whether any run of ``versions`` (None: any) has
        an owner with a heartbeat older than ``stale_after_s`` by it: where a reaper pass
        starts, in one read."""
        params = {"b_stale": stale_after_s, **served(versions)}
        with self.engine.connect() as conn:
            now, any_orphan = conn.execute(_CENSUS, params).one()
            return float(now), bool(any_orphan)

    def claim_orphans(
        self,
        *,
        owner: str,
        stale_after_s: float,
        max_attempts: int,
        batch: int,
        before: float | None = None,
        versions: Sequence[str] | None = None,
    ) -> tuple[list[Run], list[str]]:
        """Take over up to ``batch`` runs whose owner's heartbeat is older than
        ``stale_after_s`` (database clock), oldest first, and older than ``before`` if
        given (a reaper's pass passes its start, so it never takes one run twice). Each
        claim is a conditional UPDATE that re-checks staleness and gives a new lease epoch
        that counts the attempt; a run already at ``max_attempts`` is failed instead
        (``recovery_exhausted``). Returns (claimed, exhausted ids). On PostgreSQL the
        batch is one statement.

        Safe to run twice or concurrently: candidates are locked with SKIP LOCKED on
        PostgreSQL (SQLite serialises writers), and a run another reaper claimed has a
        fresh heartbeat, so the re-check leaves it alone. Only runs of ``versions`` (None:
        any) are taken: an orphan of a version this reaper does not serve stays stranded.
        """
        params = {
            **served(versions),
            "b_owner": owner,
            "b_stale": stale_after_s,
            "b_max": max_attempts,
            "b_batch": batch,
            "b_before": _NO_CUTOFF if before is None else before,
        }
        with self.begin() as conn:
            if self.dialect.one_statement_claims:
                rows = conn.execute(_PG_CLAIM_ORPHANS, params).all()
                claimed = [Run.from_row(r._mapping) for r in rows if r.id is not None]
                exhausted = list(rows[0].exhausted or []) if rows else []
                mark(conn, *(run.id for run in claimed), *exhausted)  # recovering / failed
                return claimed, exhausted
            return self._claim_orphans(conn, params)

    def _claim_orphans(
        self, conn: Connection, params: dict[str, Any]
    ) -> tuple[list[Run], list[str]]:
        """The orphan claim as a statement sequence, one run at a time (SQLite)."""
        claimed: list[Run] = []
        exhausted: list[str] = []
        candidates = self.dialect.candidates(_ORPHANS)
        for run_id in conn.execute(candidates, params).scalars().all():
            row = _RECOVER.one(conn, {**params, "b_id": run_id})
            if row is not None:
                run = Run.from_row(row._mapping)
                claimed.append(run)
                data = {"recovery_attempts": run.recovery_attempts, "owner": params["b_owner"]}
                add_event(conn, run_id, "recovering", data)
                continue
            failed = _EXHAUST.one(conn, {**params, "b_id": run_id})
            if failed is not None:
                exhausted.append(run_id)
                data = {
                    "reason": FailReason.RECOVERY_EXHAUSTED.value,
                    "recovery_attempts": failed.recovery_attempts,
                }
                add_event(conn, run_id, "failed", data)
        return claimed, exhausted

    def continue_halted(
        self, *, run_id: str, user_id: str, limits: Limits, by: str, why: str | None
    ) -> Run | None:
        """halted → running (handed to the workers) with the granted ``limits``, logging
        the grant: who, why, the previous halt reason, the old and new limits. None if the
        run is not the user's halted run (the caller tells which)."""
        params = {"b_id": run_id, "b_user": user_id}
        with self.begin() as conn:
            # Read (locked) only for the grant's record; the change itself is the CAS.
            before = conn.execute(self.dialect.lock(_HALTED_OF_USER), params).first()
            if before is None:
                return None
            old = Run.from_row(before._mapping)
            granted = {f"b_{name}": value for name, value in limits.to_json().items()}
            row = _CONTINUE.one(conn, {**params, **granted})
            if row is None:
                return None
            grant = {
                "by": by,
                "why": why,
                "previous_halt_reason": old.halt_reason,
                "old_limits": old.limits.to_json(),
                "new_limits": limits.to_json(),
                "budget": old.budget.to_json(),
            }
            add_event(conn, run_id, "continued", grant)
            self.dialect.wake(conn)
            return Run.from_row(row._mapping)

    def cancel(self, *, run_id: str, user_id: str, by: str) -> Run | None:
        """Any non-terminal state → cancelled. A live owner's next fenced write then fails,
        so it stops. None if the run is not the user's or is already terminal."""
        with self.begin() as conn:
            row = _CANCEL.one(conn, {"b_id": run_id, "b_user": user_id})
            if row is None:
                return None
            add_event(conn, run_id, "cancelled", {"by": by})
            return Run.from_row(row._mapping)
