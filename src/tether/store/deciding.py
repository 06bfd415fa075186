"""The one write of a decision (reference §4, §15, §19), inside the transaction
``Claims.claim_decision`` opens: an approval of a quorum call counted first (the N-th goes
on), then the conditional UPDATE that records the decision and claims the run when it is
the suspension's last, and the audit records of what took effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.runs import Run, RunState
from tether.store import audit
from tether.store.approvals import Vote, vote
from tether.store.audit import AuditKind
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect
from tether.store.records import Decision
from tether.store.sql.claims import ID, RUNNING
from tether.store.sql.schema import audit as audit_table
from tether.store.sql.schema import decisions, pending_calls, runs, user_load
from tether.store.sql.steps import add_event

_RUN = sa.select(runs).where(ID)
_EPOCH_OF_TOKEN = (
    sa.select(pending_calls.c.epoch)
    .where(pending_calls.c.token_hash == sa.bindparam("b_token_hash"))
    .scalar_subquery()
)
# The other decisions of the suspension a claim decided (recorded before it, still to
# carry out): they take effect with it.
_SAME_TOKEN = pending_calls.c.token_hash == decisions.c.token_hash
_OF_SUSPENSION = sa.and_(
    pending_calls.c.run_id == runs.c.id,
    pending_calls.c.epoch == _EPOCH_OF_TOKEN,
)
_THIS_ONE = decisions.c.token_hash == sa.bindparam("b_token_hash")


def _audit_insert(kind: AuditKind, which: Any, outcome: Any) -> Any:
    """An INSERT … SELECT of one audit record per decision ``which`` picks among those of
    the token's run's calls (the decision and its call's tool, its run's ids), in call
    order: one statement, whatever the number."""
    picked = (
        sa.select(
            db_now(),
            sa.literal(kind.value),
            runs.c.id,
            sa.func.coalesce(runs.c.root_run_id, runs.c.id),
            runs.c.user_id,
            decisions.c.decided_by,
            pending_calls.c.tool,
            decisions.c.tool_call_id,
            decisions.c.digest,
            decisions.c.decision,
            decisions.c.reason,
            outcome,
        )
        .select_from(decisions.join(pending_calls, _SAME_TOKEN).join(runs, ID))
        .where(pending_calls.c.run_id == runs.c.id, which)
        .order_by(pending_calls.c.position)
    )
    columns = ["at", "kind", "run_id", "root_run_id", "user_id", "by", "tool"]
    columns += ["tool_call_id", "digest", "decision", "reason", "outcome"]
    return audit_table.insert().from_select(columns, picked)


# A decision stored before it took effect (others of its turn undecided): ``recorded``.
_AUDIT_RECORDED = _audit_insert(AuditKind.RECORDED, _THIS_ONE, sa.literal("recorded"))
# A decision that decided its suspension takes effect with every decision recorded before
# it there: a ``decided`` record each, its outcome the event its decision recorded.
_AUDIT_DECIDED = _audit_insert(
    AuditKind.DECIDED,
    _OF_SUSPENSION,
    sa.case(
        (decisions.c.decision == "decline", "declined"),
        (decisions.c.decision == "edit", "edited"),
        else_="approved",
    ),
)


@dataclass(frozen=True, kw_only=True)
class SuspensionClaim:
    """What a decision on a call of a suspension found: the run as its UPDATE left it
    with the decision it recorded (``claimed``: this decision was the last of the
    suspension and claimed the run; otherwise it is recorded and the run still waits on
    ``run.undecided`` calls), or (``run`` None) the decision that had already used the
    token; neither when the token is unknown, expired or superseded."""

    run: Run | None = None
    decision: Decision | None = None
    # A quorum call's approval counted before the N-th (reference §19): how many approvals
    # of its artefact there are now; nothing else was written.
    approvals: int | None = None
    # A quorum call's approval of an artefact that is no longer the call's: nothing written.
    stale: bool = False

    @property
    def claimed(self) -> bool:
        return self.claimed_or_ready and self.run is not None and self.run.owner is not None

    @property
    def claimed_or_ready(self) -> bool:
        """The suspension is decided: the run is claimed, or (its user at the cap) ready
        for a worker."""
        return self.run is not None and self.run.state is RunState.RUNNING


_USER_LOAD_OF_RUN = sa.select(user_load.c.carried).where(
    user_load.c.user_id == sa.select(runs.c.user_id).where(ID).scalar_subquery()
)


def _has_slot(conn: Connection, dialect: Dialect, run_id: str, cap: int) -> bool:
    """Whether the user of ``run_id`` carries fewer than ``cap`` runs, their row locked
    until the transaction ends (so no claim for them slips in meanwhile)."""
    carried = conn.execute(dialect.lock(_USER_LOAD_OF_RUN), {"b_id": run_id}).scalar()
    return carried is None or carried < cap


def decide(
    conn: Connection,
    dialect: Dialect,
    params: dict[str, Any],
    *,
    cap: int | None,
    quorum: int,
    tool: str | None,
) -> SuspensionClaim | None:
    """Record the decision of ``params`` (``Claims.claim_decision``'s) in ``conn``'s
    transaction: the user's row first when ``cap`` is set (as every claim takes it), then
    a quorum call's approval counted, then the claim; with its audit records. None when
    nothing was written (the token is used, unknown or expired: the caller reads why)."""
    if cap is not None and not _has_slot(conn, dialect, params["b_id"], cap):
        params["b_owner"] = None  # ready for a worker once the user has a slot
    if quorum > 1 and params["b_decision"] == "approve":
        counted = _counted(conn, dialect, params, quorum, tool)
        if counted is not None:
            return counted
    won = dialect.claim_suspension(conn, params)
    if won is None:
        return None
    run, recorded = won
    if run.state is RUNNING and run.owner is None:
        dialect.wake(conn)
    _audit_decision(conn, run, params)
    return SuspensionClaim(run=run, decision=recorded)


def _counted(
    conn: Connection, dialect: Dialect, params: dict[str, Any], quorum: int, tool: str | None
) -> SuspensionClaim | None:
    """A quorum call's approval counted (``approvals.vote``): the answer when it is not
    the N-th (recorded, with its event and audit record, or stale), None when it is (the
    claim goes on) or when its token no longer names a call to decide (the claim says
    why)."""
    found, count = vote(conn, dialect, params, quorum)
    if found is Vote.STALE:
        return SuspensionClaim(stale=True)
    if found is not Vote.RECORDED:
        return None
    run = Run.from_row(conn.execute(_RUN, params).one()._mapping)
    data = {
        "by": params["b_approver"],
        "tool_call_id": params["b_call_id"],
        "approvals": count,
        "quorum": quorum,
        "digest": params["b_digest"],
        "reason": params["b_reason"],
    }
    add_event(conn, run.id, "approval_recorded", data)
    record = audit.of_run(
        run,
        by=params["b_approver"],
        tool=tool,
        tool_call_id=params["b_call_id"],
        digest=params["b_digest"],
        decision="approve",
        reason=params["b_reason"],
        outcome="recorded",
    )
    audit.append(conn, AuditKind.RECORDED, [record])
    return SuspensionClaim(run=run, approvals=count)


def _audit_decision(conn: Connection, run: Run, params: dict[str, Any]) -> None:
    """The audit records of a decision (``_AUDIT_DECIDED`` or ``_AUDIT_RECORDED``)."""
    took_effect = run.state is RUNNING
    conn.execute(_AUDIT_DECIDED if took_effect else _AUDIT_RECORDED, params)
