"""A quorum's approvals (reference §19): each person's approval of a call's current
artefact (its preview's digest), counted in the transaction that records it.

Every approval of a run's calls first locks the run's row (the row its decisions' claim
updates), so approvals of one call, and the N-th approvals of two calls of one turn, are
counted one after the other: of N approvers racing, exactly one finds N-1 before it and
goes on to the claim, in the same transaction; a later one finds the token used.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.errors import AlreadyDecided
from tether.runs import PendingCall, Run, RunState, iso
from tether.store import audit
from tether.store.audit import AuditKind
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect
from tether.store.base import StoreBase
from tether.store.sql.schema import approvals, decisions, pending_calls, runs
from tether.store.sql.sealed import SealedJSON
from tether.store.sql.steps import add_event
from tether.store.sql.transitions import state_in

_TOKEN: Any = sa.bindparam("b_token_hash")
_LOCK_RUN = sa.select(runs.c.id).where(runs.c.id == sa.bindparam("b_id"))
_RUN = sa.select(runs).where(runs.c.id == sa.bindparam("b_id"))
# The token's call while it may still be decided: its run suspended on it (the call's
# epoch is the run's), inside the window by the database's clock, the token unused.
_USABLE = (
    sa.select(pending_calls.c.call, pending_calls.c.tool_call_id)
    .select_from(pending_calls.join(runs, runs.c.id == pending_calls.c.run_id))
    .where(
        pending_calls.c.token_hash == _TOKEN,
        runs.c.id == sa.bindparam("b_id"),
        state_in([RunState.SUSPENDED]),
        pending_calls.c.epoch == runs.c.lease_epoch,
        runs.c.expires_at > db_now(),
        ~sa.exists().where(decisions.c.token_hash == _TOKEN),
    )
)
_MINE = sa.select(approvals.c.approver).where(
    approvals.c.token_hash == _TOKEN,
    approvals.c.approver == sa.bindparam("b_approver"),
    approvals.c.digest == sa.bindparam("b_round"),
)
_COUNT = sa.select(sa.func.count()).where(
    approvals.c.token_hash == _TOKEN, approvals.c.digest == sa.bindparam("b_round")
)
_INSERT = approvals.insert().values(
    token_hash=_TOKEN,
    approver=sa.bindparam("b_approver"),
    digest=sa.bindparam("b_round"),
    approved_at=db_now(),
    reason=sa.bindparam("b_reason"),
)
_CLEAR_ROUND = approvals.delete().where(approvals.c.token_hash == _TOKEN)
_NEW_ARTEFACT = (
    pending_calls.update()
    .where(pending_calls.c.token_hash == _TOKEN)
    .values(call=sa.bindparam("b_call", type_=SealedJSON), digest=sa.bindparam("b_call_digest"))
)
# The run's first pending call is also its ``pending`` (reference §6): kept the same.
_NEW_FIRST = (
    runs.update()
    .where(runs.c.id == sa.bindparam("b_id"), runs.c.pending_token_hash == _TOKEN)
    .values(pending=sa.bindparam("b_call", type_=SealedJSON))
)
_OF_CALLS = (
    sa.select(
        approvals.c.token_hash, approvals.c.approver, approvals.c.digest, approvals.c.approved_at
    )
    .where(approvals.c.token_hash.in_(sa.bindparam("b_hashes", expanding=True)))
    .order_by(approvals.c.approved_at, approvals.c.approver)
)


class Vote(str, enum.Enum):
    """What an approval of a quorum call found."""

    RECORDED = "recorded"  # counted; the quorum is not reached yet
    REACHED = "reached"  # counted, and the N-th: the caller claims in the same transaction
    STALE = "stale"  # the call's artefact is not the one the approver saw
    UNUSABLE = "unusable"  # the token no longer names a call to decide (the claim says why)


def round_of(call: Any) -> str:
    """The artefact a call's approvals are of: its preview's digest ("" without one)."""
    return str((call or {}).get("digest") or "")


def vote(
    conn: Connection, dialect: Dialect, params: dict[str, Any], quorum: int
) -> tuple[Vote, int]:
    """Count the approval of ``params`` (``b_id``, ``b_token_hash``, ``b_approver``,
    ``b_digest``: the digest the approver saw, ``b_reason``) of a call that waits on
    ``quorum`` people, the run's row locked first; and how many approvals of its current
    artefact there are with it. ``already_decided`` when this person already approved it."""
    conn.execute(dialect.lock(_LOCK_RUN), params)
    row = conn.execute(_USABLE, params).first()
    if row is None:
        return Vote.UNUSABLE, 0
    params["b_call_id"] = row.tool_call_id
    current = round_of(row.call)
    if (params["b_digest"] or "") != current:
        return Vote.STALE, 0
    counted = {**params, "b_round": current}
    if conn.execute(_MINE, counted).first() is not None:
        raise AlreadyDecided(
            f"{params['b_approver']} already approved this request as it is now; each person "
            "counts once toward its quorum",
            approver=params["b_approver"],
        )
    before = int(conn.execute(_COUNT, counted).scalar_one())
    conn.execute(_INSERT, counted)
    count = before + 1
    return (Vote.REACHED if count >= quorum else Vote.RECORDED), count


def start_round(
    conn: Connection, dialect: Dialect, params: dict[str, Any], call: dict[str, Any]
) -> str | None:
    """Replace the call's artefact by ``call`` (an approver's edit, reference §19) and start
    its new round with the editor's approval, when the artefact is still the one they saw
    (``b_digest``); the tool call id it is of, or None when it is not (or the token no
    longer names a call to decide)."""
    conn.execute(dialect.lock(_LOCK_RUN), params)
    row = conn.execute(_USABLE, params).first()
    if row is None or (params["b_digest"] or "") != round_of(row.call):
        return None
    fresh = {**params, "b_call": call, "b_round": round_of(call)}
    fresh["b_call_digest"] = call.get("digest")
    conn.execute(_CLEAR_ROUND, fresh)
    conn.execute(_NEW_ARTEFACT, fresh)
    conn.execute(_NEW_FIRST, fresh)
    conn.execute(_INSERT, fresh)
    return str(row.tool_call_id)


def with_approvals(
    conn: Connection, calls: Sequence[PendingCall]
) -> dict[str, tuple[dict[str, Any], ...]]:
    """The approvals of each quorum call's current artefact (``{"by", "at"}``, oldest
    first), by its token's hash; one read, and none when no call waits on a quorum."""
    counted = {c.token_hash: round_of(c.pending.to_json()) for c in calls if c.pending.quorum > 1}
    if not counted:
        return {}
    found: dict[str, list[dict[str, Any]]] = {}
    for row in conn.execute(_OF_CALLS, {"b_hashes": list(counted)}):
        if row.digest == counted[row.token_hash]:
            found.setdefault(row.token_hash, []).append(
                {"by": row.approver, "at": iso(row.approved_at)}
            )
    return {token: tuple(listed) for token, listed in found.items()}


class Rounds(StoreBase):
    """Starting a quorum call's new round on an approver's edit."""

    def start_round(
        self,
        *,
        run_id: str,
        token_hash: str,
        approver: str,
        seen_digest: str | None,
        call: dict[str, Any],
        reason: str | None,
        event: dict[str, Any],
        tool: str | None,
    ) -> bool:
        """Replace the quorum call's artefact with ``call`` (its edited arguments, preview
        and digest) and count the editor's approval as the first of its new round, with
        an ``approval_recorded`` event (``event``: its data) and an audit record, in one
        transaction; False, with nothing written, when the call's artefact is no longer
        the one the editor saw (``seen_digest``) or its token names nothing to decide."""
        params = {
            "b_id": run_id,
            "b_token_hash": token_hash,
            "b_approver": approver,
            "b_digest": seen_digest,
            "b_reason": reason,
        }
        with self.begin() as conn:
            call_id = start_round(conn, self.dialect, params, call)
            if call_id is None:
                return False
            run = Run.from_row(conn.execute(_RUN, params).one()._mapping)
            digest = call.get("digest")
            data = {"by": approver, "tool_call_id": call_id, "approvals": 1, "digest": digest}
            add_event(conn, run_id, "approval_recorded", {**data, **event, "reason": reason})
            record = audit.of_run(
                run,
                by=approver,
                tool=tool,
                tool_call_id=call_id,
                digest=digest,
                decision="approve",
                reason=reason,
                outcome="recorded",
            )
            audit.append(conn, AuditKind.RECORDED, [record])
            return True
