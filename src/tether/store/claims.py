"""The owner changes that are not a running owner's own writes: claims of ready runs,
suspensions and orphans, continuing a halted run, cancelling (creating a run is
``creation``).

Every state change here is a ``Transition`` (one conditional UPDATE checked against the
table), so two claimers racing for one run cannot both win: the loser's UPDATE matches
no row and it is told so (None). The claims' statements are ``sql.claims``, their order
``sql.claim_order``; the claims of suspensions and orphans are sent by the dialect
(``Dialect.claim_suspension``, ``Dialect.claim_orphans``): statement sequences, or one
statement each on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from tether.budget import Limits
from tether.runs import Run, RunState, can_transition
from tether.store import audit
from tether.store.audit import AuditKind
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.deciding import SuspensionClaim as SuspensionClaim
from tether.store.deciding import decide
from tether.store.records import Decision
from tether.store.sql.claim_order import claim_next
from tether.store.sql.claims import (
    CLAIM_GIVEN,
    CLAIM_GIVEN_CAPPED,
    ID,
    NO_CUTOFF,
    RUNNING,
    STALE,
)
from tether.store.sql.fair_pick import pick_sizes
from tether.store.sql.schema import decisions, runs
from tether.store.sql.served import served
from tether.store.sql.steps import add_event
from tether.store.sql.transitions import Transition, state_in
from tether.store.suspensions import clear_calls
from tether.store.threads import moved_on
from tether.store.trees import descendants, stopped
from tether.store.users import admit

_RUN = sa.select(runs).where(ID)
_DECISION_OF_TOKEN = sa.select(decisions).where(
    decisions.c.token_hash == sa.bindparam("b_token_hash")
)
# A claim's event by its decision: an edit approved without the digest of its preview
# (``edit``) is recorded ``edited``, never ``approved`` (reference §9).
_EVENT_OF = {"decline": "declined", "edit": "edited"}
_CENSUS = sa.select(db_now(), sa.select(runs.c.id).where(state_in([RUNNING]), STALE).exists())


_LIMITS = ("max_steps", "max_spend_usd", "max_tool_calls", "max_elapsed_ms")
_GRANTED: dict[str, Any] = {name: sa.bindparam(f"b_{name}") for name in _LIMITS}
_HALTED_OF_USER = sa.select(runs).where(
    ID, runs.c.user_id == sa.bindparam("b_user"), state_in([RunState.HALTED, RunState.WAITING])
)
# A grant to a waiting parent (reference §18): its limits raised, its state unchanged.
_GRANT_WAITING = (
    runs.update()
    .where(ID, runs.c.user_id == sa.bindparam("b_user"), state_in([RunState.WAITING]))
    .values(updated_at=db_now(), **_GRANTED)
    .returning(runs)
)
# The runs of its subtree the grant resumes: those its limits halted (``halted_by``).
_RESUME_HALTED_BY = Transition(
    RunState.HALTED,
    RUNNING,
    runs.c.root_run_id == sa.bindparam("b_root"),
    runs.c.halted_by == sa.bindparam("b_id"),
    runs.c.id != sa.bindparam("b_id"),
    owner=None,
    halt_reason=None,
    halted_by=None,
    pending=None,
    undecided=0,
    ready_at=None,
    updated_at=db_now(),
    returning=(runs.c.id,),
)
_CONTINUE = Transition(
    RunState.HALTED,
    RUNNING,
    ID,
    runs.c.user_id == sa.bindparam("b_user"),
    owner=None,
    halt_reason=None,
    halted_by=None,
    pending=None,
    undecided=0,  # its suspension's calls are forgotten with it (``clear_calls``)
    ready_at=None,
    updated_at=db_now(),
    **_GRANTED,
)

# Any state the table lets the owner cancel from (every state that is not terminal).
_CANCEL = Transition(
    [state for state in RunState if can_transition(state, RunState.CANCELLED)],
    RunState.CANCELLED,
    ID,
    runs.c.user_id == sa.bindparam("b_user"),
    owner=None,
    ready_at=None,
    updated_at=db_now(),
)

_CANCEL_MANY = Transition(
    [state for state in RunState if can_transition(state, RunState.CANCELLED)],
    RunState.CANCELLED,
    runs.c.id.in_(sa.bindparam("b_ids", expanding=True)),
    runs.c.user_id == sa.bindparam("b_user"),
    owner=None,
    ready_at=None,
    updated_at=db_now(),
    returning=(runs.c.id,),
)


class Claims(StoreBase):
    """Claiming runs, continuing and cancelling them."""

    def claim_ready(
        self,
        owner: str,
        run_id: str | None = None,
        *,
        versions: Sequence[str] | None = None,
        cap: int | None = None,
    ) -> Run | None:
        """Take the lease of a run of ``versions`` (None: any) that waits for a worker: the
        given one, or the best by priority then age (``claim_order``) of those ready
        (running, no owner, not delayed past the database's clock), those queued whose
        thread's earlier runs have all stopped and those whose start time has come. With
        ``cap``, only a run of a user with fewer than ``cap`` runs carried. None if there is
        none to take.

        One conditional UPDATE picks and claims, so it is safe to race: the claim is
        conditional on ``owner IS NULL`` (on the thread being idle and the start time
        past, for a queued run), and on PostgreSQL the pick skips rows other claimers
        hold, so concurrent workers pick different runs.
        """
        if run_id is None:
            claimed = self.claim_waiting(owner, 1, versions=versions, cap=cap)
            return claimed[0] if claimed else None
        params: dict[str, Any] = {"b_owner": owner, "b_cap": cap, **served(versions)}
        params["b_id"] = run_id
        claim = CLAIM_GIVEN if cap is None else CLAIM_GIVEN_CAPPED
        with self.begin() as conn:
            row = claim.one(conn, params)
            return Run.from_row(row._mapping) if row else None

    def claim_waiting(
        self,
        owner: str,
        limit: int,
        *,
        versions: Sequence[str] | None = None,
        cap: int | None = None,
    ) -> list[Run]:
        """Take the leases of up to ``limit`` of the best runs that wait for a worker, as
        ``claim_ready`` picks one, in one conditional UPDATE: a worker filling many free
        slots claims them together rather than one transaction (and one thread hop) each.
        With ``cap``, at most one, each claim re-reading its user's count. A COMMIT cut
        off is settled by asking PostgreSQL the transaction's fate."""
        params: dict[str, Any] = {"b_owner": owner, "b_cap": cap, **served(versions)}
        limit, spare = max(1, limit), self.dialect.skips_locked
        claim = claim_next(self.dialect, capped=cap is not None)

        # A COMMIT cut off would leave the runs claimed by a worker that does not know
        # it, each taken back by a reaper a heartbeat timeout later at the cost of a
        # recovery attempt: it is settled at once instead (``StoreBase.settled``).
        def claimed(every: bool) -> Sequence[sa.Row[Any]]:
            bounds = {**params, **pick_sizes(limit, spare=spare, every=every)}
            return self.settled(
                lambda conn: claim.many(conn, bounds),
                lambda found: found[0].xid if found and self.dialect.xid is not None else None,
            )

        # The pick reads the first users in the order of their first waiting runs; when
        # that cannot tell (many of those runs delayed, or of versions not served) it takes
        # nothing, and the claim reads every user instead (``fair_pick``), in a transaction
        # of its own: the first may have locked rows, and its locks taken in the order of
        # one statement must not be held into another's.
        rows = claimed(every=False) or claimed(every=True)
        return [Run.from_row(row._mapping) for row in rows]

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
        cap: int | None = None,
        quorum: int = 1,
        tool: str | None = None,
    ) -> SuspensionClaim:
        """The one write of a decision (invariant 5): conditional on the token's
        suspension being the run's current one (the lease epoch it began at), on the
        token being unused and on ``expires_at`` against the database's clock, it records
        the decision on the token's call (who, when, the approver's ``reason``, the
        ``arguments`` the call is to run with when they are not the model's, and the
        ``digest`` the approver saw, by default the call's own) and its
        ``approved`` / ``declined`` event (``event``: its data) in the same transaction;
        the decision that leaves none of the suspension's calls undecided claims the run
        (suspended → running under ``owner``) in that same UPDATE.

        A decision that lost reads, in the same transaction, the decision that used the
        token (a new statement sees what the winner committed while this UPDATE waited on
        its lock), so a loser is answered without another trip to the store; one that
        lost to a concurrent decision of the same token in another process meets the
        decisions' primary key and is answered the same way. Only a run of ``versions``
        (None: any) is decided; the caller tells a run of another version apart
        (``wrong_version``).

        With ``cap`` (reference §13), the run's user's row of ``user_load`` is locked
        first; when the user already has ``cap`` runs carried, the last decision leaves
        the run ready for a worker (running, no owner) instead of claiming it: the
        decision is recorded, and the worker that claims the run once a slot frees
        carries it out, with every re-check an approval makes.

        An approval of a call that waits on ``quorum`` people (reference §19) is counted
        first (``approvals.vote``, the run's row locked): before the N-th it is recorded
        alone (``approvals``); the N-th goes on to the claim in the same transaction. Each
        decision and recorded approval appends its audit record (of ``tool``) here too."""
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
            "b_kind": _EVENT_OF.get(decision, "approved"),
            "b_event": {"decision": decision, "by": approver, **(event or {})},
        }
        try:
            with self.begin() as conn:
                won = decide(conn, self.dialect, params, cap=cap, quorum=quorum, tool=tool)
                if won is not None:
                    return won
                used = conn.execute(_DECISION_OF_TOKEN, params).first()
        except sa.exc.IntegrityError:  # the same token, decided meanwhile elsewhere
            with self.engine.connect() as conn:
                used = conn.execute(_DECISION_OF_TOKEN, params).first()
        return SuspensionClaim(decision=Decision.from_row(used._mapping) if used else None)

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
            "b_before": NO_CUTOFF if before is None else before,
        }
        with self.begin() as conn:
            claimed, exhausted = self.dialect.claim_orphans(conn, params)
            stopped(conn, self.dialect, exhausted, RunState.FAILED.value)
            return claimed, exhausted

    def continue_halted(
        self, *, run_id: str, user_id: str, limits: Limits, by: str, why: str | None
    ) -> Run | None:
        """halted → running (handed to the workers) with the granted ``limits``, logging
        the grant: who, why, the previous halt reason, the old and new limits. Every run of
        its subtree halted by its limits (``halted_by``, reference §18) resumes with it, in
        the same transaction, listed in the grant's one ``continued`` event (``resumed``);
        a ``waiting`` parent that some of them name gets the grant and keeps waiting. None
        if the run is not the user's halted run, nor a waiting run that a run of its
        subtree names (the caller tells which); ``InvalidInput`` if the user was removed."""
        params = {"b_id": run_id, "b_user": user_id}
        with self.begin() as conn:
            admit(conn, self.dialect, user_id)  # the user's row first, as a creation does
            # Then the thread (every writer that adds a run to it or deletes it takes its
            # lock before a run's), so the run goes on only while it is the latest.
            moved_on(conn, self.dialect, run_id)
            # Read (locked) only for the grant's record; the change itself is the CAS.
            before = conn.execute(self.dialect.lock(_HALTED_OF_USER), params).first()
            if before is None:
                return None
            old = Run.from_row(before._mapping)
            granted = {f"b_{name}": value for name, value in limits.to_json().items()}
            subtree = {"b_root": old.root_run_id, "b_id": run_id}
            resumed = [str(r.id) for r in _RESUME_HALTED_BY.many(conn, subtree)]  # deeper first
            if old.state is RunState.WAITING and not resumed:
                return None
            if old.state is RunState.WAITING:
                row = conn.execute(_GRANT_WAITING, {**params, **granted}).first()
            else:
                row = _CONTINUE.one(conn, {**params, **granted})
            if row is None:
                return None
            grant: dict[str, Any] = {
                "by": by,
                "why": why,
                "previous_halt_reason": old.halt_reason,
                "old_limits": old.limits.to_json(),
                "new_limits": limits.to_json(),
                "budget": old.budget.to_json(),
            }
            if resumed:
                grant["resumed"] = resumed
            for resumed_id in resumed:
                clear_calls(conn, resumed_id)
            clear_calls(conn, run_id)  # its suspension's tokens and decisions are void
            add_event(conn, run_id, "continued", grant)
            record = audit.of_run(old, by=by, reason=why, outcome="resumed")
            audit.append(conn, AuditKind.CONTINUED, [record])
            self.dialect.wake(conn)
            return Run.from_row(row._mapping)

    def cancel(self, *, run_id: str, user_id: str, by: str) -> Run | None:
        """Any non-terminal state → cancelled, with every descendant of it that is not
        terminal (reference §18), deepest first, in one transaction. A live owner's next
        fenced write then fails, so it stops. A child cancelled by itself stops its
        parent's wait like any child that stops. None if the run is not the user's or is
        already terminal."""
        with self.begin() as conn:
            gone: list[dict[str, Any]] = []
            for ids in descendants(conn, run_id):  # deepest first: a child before its parent
                for child in _CANCEL_MANY.many(conn, {"b_ids": ids, "b_user": user_id}):
                    add_event(conn, child.id, "cancelled", {"by": by, "with": run_id})
                    gone.append({"run_id": child.id, "reason": f"cancelled with {run_id}"})
            row = _CANCEL.one(conn, {"b_id": run_id, "b_user": user_id})
            if row is None:
                return None
            add_event(conn, run_id, "cancelled", {"by": by})
            cancelled = Run.from_row(row._mapping)
            records = [audit.of_run(cancelled, by=by, outcome="cancelled")]
            records += [{**records[0], **child} for child in gone]
            audit.append(conn, AuditKind.CANCELLED, records)
            stopped(conn, self.dialect, [run_id], RunState.CANCELLED.value)
            # A queued follow-up of its thread may start now.
            self.dialect.wake(conn)
            return Run.from_row(row._mapping)
