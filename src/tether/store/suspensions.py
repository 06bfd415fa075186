"""A suspension's calls (reference §15): each call of a turn that waits on a human, with
its own token, stored as a row of ``pending_calls``; what a token names; the decisions a
run's unanswered calls carry.

A suspension's rows are written with it (``write_calls``, in the suspending transaction)
and are those whose ``epoch`` is the run's lease epoch while it is suspended. The
decision on a call is recorded by ``claims.claim_decision``; the rows stay after the claim,
so the owner that carries the turn out, or the one that recovers it after a crash, reads
every decision of the turn with the run (``decisions_of``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.reasons import HaltReason
from tether.runs import Lease, Pending, PendingCall, Run, RunState, iso
from tether.store.approvals import with_approvals
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.records import Decision
from tether.store.sql.schema import decisions, pending_calls, runs

_DECISION_COLUMNS = [c.label(f"d_{c.name}") for c in decisions.c]
_WITH_DECISION = pending_calls.outerjoin(
    decisions, decisions.c.token_hash == pending_calls.c.token_hash
)

# A call's row with its run, the decision that used its token, and whether the run's
# window is open by the database's clock.
_CALL_AND_RUN = sa.select(
    runs,
    pending_calls.c.token_hash.label("p_token_hash"),
    pending_calls.c.position.label("p_position"),
    pending_calls.c.epoch.label("p_epoch"),
    pending_calls.c.call.label("p_call"),
    pending_calls.c.suspended_at.label("p_suspended_at"),
    pending_calls.c.escalated_at.label("p_escalated_at"),
    (runs.c.expires_at > db_now()).label("window_open"),
    *_DECISION_COLUMNS,
).select_from(_WITH_DECISION.join(runs, runs.c.id == pending_calls.c.run_id))
# What a token names: the call's own token (the primary key's lookup), or the token an
# escalation gave it (reference §19).
_TOKEN = _CALL_AND_RUN.where(pending_calls.c.token_hash == sa.bindparam("b_hash"))
_ALIAS = _CALL_AND_RUN.where(pending_calls.c.alias_hash == sa.bindparam("b_hash"))
# A call of a run's current suspension, by its id (the inbox and the batch endpoint know
# the run and the call, never the token).
_CALL = _CALL_AND_RUN.where(
    pending_calls.c.run_id == sa.bindparam("b_id"),
    pending_calls.c.tool_call_id == sa.bindparam("b_call"),
    pending_calls.c.epoch == runs.c.lease_epoch,
)
_DECISION_OF_TOKEN = sa.select(decisions).where(decisions.c.token_hash == sa.bindparam("b_hash"))
# The calls of some runs' suspensions with their decisions, in call order.
_CALLS_OF = (
    sa.select(pending_calls, *_DECISION_COLUMNS)
    .select_from(_WITH_DECISION)
    .where(pending_calls.c.run_id.in_(sa.bindparam("b_ids", expanding=True)))
    .order_by(pending_calls.c.run_id, pending_calls.c.position)
)
_INSERT_CALL = pending_calls.insert().values(
    suspended_at=db_now(),
    escalate_at=db_now() + sa.bindparam("b_after", type_=sa.Float),
)
# A new suspension replaces the rows of the run's earlier ones, except those of calls
# decided but not carried out yet (``b_keep``): their decisions stand.
_REPLACE = pending_calls.delete().where(
    pending_calls.c.run_id == sa.bindparam("b_id"),
    pending_calls.c.tool_call_id.not_in(sa.bindparam("b_keep", expanding=True)),
)
_CLEAR = pending_calls.delete().where(pending_calls.c.run_id == sa.bindparam("b_id"))


@dataclass(frozen=True, kw_only=True)
class TokenMatch:
    """What a token names: the run suspended on it inside its window (``run``, with the
    token's ``call``), the decision that used it, or the run whose suspension on it
    expired (``expired``: still suspended past its window until the sweep halts it, or
    halted ``suspension_expired``), each judged by the database's clock. Who may learn
    of which is the caller's to check."""

    run: Run | None = None
    call: PendingCall | None = None
    decision: Decision | None = None
    expired: Run | None = None


def decision_of(row: Any) -> Decision | None:
    """The decision columns (``d_*``) of a row, if its outer join found one."""
    if row.d_token_hash is None:
        return None
    return Decision.from_row({c.name: row._mapping[f"d_{c.name}"] for c in decisions.c})


def decided(decision: Decision | None) -> dict[str, Any] | None:
    """A decision as a pending call's ``decided`` shows it (reference §15)."""
    if decision is None:
        return None
    return {"decision": decision.decision, "by": decision.by, "at": iso(decision.at)}


def _call(
    row: Any,
    token_hash: str,
    position: int,
    epoch: int,
    call: Any,
    notified: bool = False,
    *,
    at: tuple[float | None, float | None] = (None, None),
) -> PendingCall:
    """A call of a suspension from its row (``at``: when it was suspended and escalated)."""
    return PendingCall(
        pending=Pending.from_json(call),
        token_hash=token_hash,
        position=position,
        epoch=epoch,
        decided=decided(decision_of(row)),
        notified=notified,
        suspended_at=at[0],
        escalated_at=at[1],
    )


def _matched(row: Any) -> TokenMatch:
    """What the row of a token's call says of it."""
    run = Run.from_row(row._mapping)
    used = decision_of(row)
    current = row.p_epoch == run.lease_epoch
    if current and run.state is RunState.SUSPENDED:
        if not row.window_open:
            return TokenMatch(expired=run)
        if used is not None:  # recorded while others of the turn are undecided: final
            return TokenMatch(decision=used)
        at = (row.p_suspended_at, row.p_escalated_at)
        call = _call(row, row.p_token_hash, row.p_position, row.p_epoch, row.p_call, at=at)
        return TokenMatch(run=run, call=call)
    expired = run.state is RunState.HALTED and (
        run.halt_reason == HaltReason.SUSPENSION_EXPIRED.value
    )
    if current and expired:  # every token of an expired suspension, decided or not
        return TokenMatch(expired=run)
    return TokenMatch(decision=used)


def calls_of_rows(run: Run, rows: Sequence[Any]) -> Run:
    """``run`` with the calls of its current suspension, from rows of the run joined with
    its calls (``CALL_COLUMNS``; a row without a call has them NULL)."""
    if run.state is not RunState.SUSPENDED:
        return run
    mine = sorted(
        (
            _call(
                r,
                r.p_token_hash,
                r.p_position,
                r.p_epoch,
                r.p_call,
                r.p_notified_at is not None,
                at=(r.p_suspended_at, r.p_escalated_at),
            )
            for r in rows
            if r.p_token_hash is not None and r.p_epoch == run.lease_epoch
        ),
        key=lambda c: c.position,
    )
    return dataclasses.replace(run, pending_calls=tuple(mine)) if mine else run


def with_counts(conn: Connection, run: Run) -> Run:
    """``run`` with the approvals its quorum calls have so far (reference §19); no read
    unless one of its calls waits on a quorum."""
    counted = with_approvals(conn, run.pending_calls)
    if not counted:
        return run
    calls = tuple(
        dataclasses.replace(c, approvals=counted.get(c.token_hash, ())) for c in run.pending_calls
    )
    return dataclasses.replace(run, pending_calls=calls)


def asked_of_rows(rows: Sequence[Any]) -> dict[str, Pending]:
    """What the run's suspensions asked of each call (the latest suspension's, by tool call
    id), from rows of the run joined with its calls (``CALL_COLUMNS``)."""
    asked = sorted((r for r in rows if r.p_token_hash is not None), key=lambda r: r.p_epoch)
    return {r.p_tool_call_id: Pending.from_json(r.p_call) for r in asked}


def with_calls(conn: Connection, found: Sequence[Run]) -> list[Run]:
    """``found`` with the calls of the suspended ones' suspensions, in one read."""
    held = [run.id for run in found if run.state is RunState.SUSPENDED]
    if not held:
        return list(found)
    rows = conn.execute(_CALLS_OF, {"b_ids": held}).all()
    by_run: dict[str, list[PendingCall]] = {}
    for row in rows:
        notified = row.notified_at is not None
        at = (row.suspended_at, row.escalated_at)
        call = _call(row, row.token_hash, row.position, row.epoch, row.call, notified, at=at)
        by_run.setdefault(row.run_id, []).append(call)
    current = {r.id: r.lease_epoch for r in found}
    listed = [c for run_id, calls in by_run.items() for c in calls if c.epoch == current[run_id]]
    counted = with_approvals(conn, listed)  # a quorum call's approvals so far (§19)
    out = []
    for run in found:
        mine = tuple(
            dataclasses.replace(c, approvals=counted.get(c.token_hash, ()))
            for c in by_run.get(run.id, ())
            if c.epoch == run.lease_epoch
        )
        out.append(dataclasses.replace(run, pending_calls=mine) if mine else run)
    return out


def write_calls(
    conn: Connection,
    lease: Lease,
    calls: Sequence[tuple[Pending, str]],
    keep: Sequence[str],
) -> None:
    """The rows of a new suspension of the run (``calls``: each call with its token's
    hash, in call order), replacing those of its earlier suspensions but the rows of the
    calls in ``keep`` (decided, not carried out yet)."""
    conn.execute(_REPLACE, {"b_id": lease.run_id, "b_keep": list(keep)})
    conn.execute(
        _INSERT_CALL,
        [
            {
                "token_hash": token_hash,
                "run_id": lease.run_id,
                "tool_call_id": pending.tool_call_id,
                "position": position,
                "epoch": lease.epoch,
                "call": pending.to_json(),
                "tool": pending.tool,
                "digest": pending.digest,
                "notified_at": None,
                "b_after": pending.escalate_after_s,
            }
            for position, (pending, token_hash) in enumerate(calls)
        ],
    )


def clear_calls(conn: Connection, run_id: str) -> None:
    """Forget the run's suspensions: their tokens and the decisions they carried no longer
    apply (a halted run continued is asked again)."""
    conn.execute(_CLEAR, {"b_id": run_id})


class Suspensions(StoreBase):
    """What a token, or a run and one of its calls, names now."""

    def match_token(self, token_hash: str) -> TokenMatch:
        """The run, call and decision a token names, the window judged by the database's
        clock (invariant 11): the one lookup deciding and previewing by token share."""
        params = {"b_hash": token_hash}
        with self.engine.begin() as conn:
            row = conn.execute(_TOKEN, params).first() or conn.execute(_ALIAS, params).first()
            if row is not None:
                return _matched(row)
            used = conn.execute(_DECISION_OF_TOKEN, params).first()
            return TokenMatch(decision=Decision.from_row(used._mapping) if used else None)

    def find_by_token(self, token_hash: str) -> tuple[Run | None, Decision | None]:
        """The run suspended on this token inside its window or past it (if any), and the
        decision that used it (if any)."""
        found = self.match_token(token_hash)
        return found.run or found.expired, found.decision

    def match_call(self, run_id: str, tool_call_id: str) -> TokenMatch:
        """What a call of the run's current suspension names, as its token would."""
        params = {"b_id": run_id, "b_call": tool_call_id}
        with self.engine.begin() as conn:
            row = conn.execute(_CALL, params).first()
            return _matched(row) if row is not None else TokenMatch()
