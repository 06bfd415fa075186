"""Escalating calls nobody decided in time (reference §19): a call whose tool declares
``escalate_after_min`` is due at its suspension plus that time (``escalate_at``, written
with the call by the database's clock); the first pass that finds it due and still
undecided escalates it, once fleet-wide: a conditional UPDATE on ``escalated_at IS NULL``
gives it a second token (only its hash: ``alias_hash``) for the people it is escalated
to, with its ``escalated`` event and audit record, in one transaction. The escalation's
notice is delivered like a suspension's (its delivery recorded; one never delivered goes
out again with a fresh second token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.runs import PendingCall, Run, RunState
from tether.store import audit
from tether.store.audit import AuditKind
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import decisions, pending_calls, runs
from tether.store.sql.served import SERVED, served
from tether.store.sql.steps import add_event
from tether.store.sql.transitions import state_in
from tether.store.suspensions import with_calls

_DUE = pending_calls.c.escalate_at <= db_now()
_NOT_YET = pending_calls.c.escalated_at.is_(None)
# Still a call to decide: its run suspended on it, inside the window, its token unused.
_OPEN = sa.and_(
    state_in([RunState.SUSPENDED]),
    pending_calls.c.epoch == runs.c.lease_epoch,
    runs.c.expires_at > db_now(),
    ~sa.exists().where(decisions.c.token_hash == pending_calls.c.token_hash),
)
_CALLS = pending_calls.join(runs, runs.c.id == pending_calls.c.run_id)
_DUE_CALLS = (
    sa.select(pending_calls.c.token_hash, pending_calls.c.run_id)
    .select_from(_CALLS)
    .where(pending_calls.c.escalate_at.is_not(None), _NOT_YET, _DUE, _OPEN, SERVED)
    .order_by(pending_calls.c.escalate_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
# Due calls that will never be escalated (decided, or their suspension ended): no longer due.
_VOID = (
    pending_calls.update()
    .where(
        pending_calls.c.escalate_at.is_not(None),
        _NOT_YET,
        _DUE,
        sa.or_(
            ~sa.exists().where(
                runs.c.id == pending_calls.c.run_id,
                state_in([RunState.SUSPENDED]),
                runs.c.lease_epoch == pending_calls.c.epoch,
                runs.c.expires_at > db_now(),
            ),
            sa.exists().where(decisions.c.token_hash == pending_calls.c.token_hash),
        ),
    )
    .values(escalate_at=None)
)
_ESCALATE = (
    pending_calls.update()
    .where(pending_calls.c.token_hash == sa.bindparam("b_hash"), _NOT_YET)
    .values(escalated_at=db_now(), alias_hash=sa.bindparam("b_alias"))
    .returning(pending_calls.c.tool_call_id, pending_calls.c.call)
)
_UNSENT = (
    sa.select(pending_calls.c.token_hash, pending_calls.c.run_id, pending_calls.c.alias_hash)
    .select_from(_CALLS)
    .where(
        pending_calls.c.escalated_at.is_not(None),
        pending_calls.c.escalation_notified_at.is_(None),
        pending_calls.c.escalated_at < db_now() - sa.bindparam("b_older", type_=sa.Float),
        _OPEN,
        SERVED,
    )
    .order_by(pending_calls.c.escalated_at)
    .limit(sa.bindparam("b_batch", type_=sa.Integer))
)
_NEW_ALIAS = (
    pending_calls.update()
    .where(
        pending_calls.c.alias_hash == sa.bindparam("b_old"),
        pending_calls.c.escalation_notified_at.is_(None),
    )
    .values(alias_hash=sa.bindparam("b_alias"))
)
MARK_ESCALATION_NOTIFIED = (
    pending_calls.update()
    .where(pending_calls.c.alias_hash == sa.bindparam("b_hash"))
    .values(escalation_notified_at=db_now())
)
_ESCALATED_OPEN = (
    sa.select(runs.c.user_id, pending_calls.c.call)
    .select_from(_CALLS)
    .where(pending_calls.c.escalated_at.is_not(None), _OPEN)
)
# The soonest call still to escalate, of a run still suspended on it inside its window,
# of the versions served: a call a pass could escalate (so a pass never spins on others).
_NEXT = (
    sa.select(sa.func.min(pending_calls.c.escalate_at) - db_now())
    .select_from(_CALLS)
    .where(pending_calls.c.escalate_at.is_not(None), _NOT_YET, _OPEN, SERVED)
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Escalated:
    """A call escalated (or whose escalation notice goes out again): its run with its
    calls, the call, and the hash of the token its notice carries."""

    run: Run
    call: PendingCall
    alias_hash: str


def _found(conn: Connection, picked: Mapping[str, tuple[str, str]]) -> list[Escalated]:
    """Each picked call (token hash → (run id, alias hash)) with its run read now."""
    read = sa.select(runs).where(runs.c.id.in_({run_id for run_id, _ in picked.values()}))
    found = with_calls(conn, [Run.from_row(r._mapping) for r in conn.execute(read)])
    out = []
    for run in found:
        for call in run.pending_calls:
            if call.token_hash in picked:
                out.append(Escalated(run=run, call=call, alias_hash=picked[call.token_hash][1]))
    return out


class Escalations(StoreBase):
    """Escalating due calls, and re-sending escalation notices never delivered."""

    def escalate_due(
        self,
        *,
        batch: int,
        new_hashes: Callable[[], str],
        escalate_to: Callable[[str], Sequence[str]],
        versions: Sequence[str] | None = None,
    ) -> list[Escalated]:
        """Escalate up to ``batch`` calls of runs of ``versions`` (None: any) that are due
        by the database's clock and still undecided, soonest first: each gets its second
        token's hash (``new_hashes()``), its ``escalated`` event (naming ``escalate_to(tool)``)
        and audit record. Safe to race: candidates are locked with SKIP LOCKED on
        PostgreSQL, and each escalation is conditional on ``escalated_at IS NULL``, so a
        call is escalated once whichever pass finds it first."""
        params = {"b_batch": batch, **served(versions)}
        picked: dict[str, tuple[str, str]] = {}
        with self.begin() as conn:
            due = self.dialect.candidates(_DUE_CALLS, of=pending_calls)
            rows = conn.execute(due, params).all()
            records = []
            for row in rows:
                alias = new_hashes()
                hit = conn.execute(_ESCALATE, {"b_hash": row.token_hash, "b_alias": alias}).first()
                if hit is None:
                    continue
                picked[row.token_hash] = (row.run_id, alias)
                tool = str(hit.call.get("tool"))
                to = list(escalate_to(tool))
                data = {"tool_call_id": hit.tool_call_id, "tool": tool, "escalate_to": to}
                add_event(conn, row.run_id, "escalated", data)
                records.append((row.run_id, hit, tool, to))
            escalated = _found(conn, picked) if picked else []
            runs_of = {e.run.id: e.run for e in escalated}
            audit.append(
                conn,
                AuditKind.ESCALATED,
                [
                    audit.of_run(
                        runs_of[run_id],
                        tool=tool,
                        tool_call_id=hit.tool_call_id,
                        digest=hit.call.get("digest"),
                        reason=f"escalated to {', '.join(to)}"[:2000],
                        outcome="escalated",
                    )
                    for run_id, hit, tool, to in records
                    if run_id in runs_of
                ],
            )
            return escalated

    def reissue_escalations(
        self,
        *,
        older_than_s: float,
        batch: int,
        new_hashes: Callable[[], str],
        versions: Sequence[str] | None = None,
    ) -> list[Escalated]:
        """Give each escalated call whose escalation notice was not delivered within
        ``older_than_s`` a fresh second token (conditional on the old one's hash and on the
        notice still undelivered, so a notice being delivered is never overtaken)."""
        params = {"b_older": older_than_s, "b_batch": batch, **served(versions)}
        picked: dict[str, tuple[str, str]] = {}
        with self.begin() as conn:
            due = self.dialect.candidates(_UNSENT, of=pending_calls)
            for row in conn.execute(due, params).all():
                swap = {"b_old": row.alias_hash, "b_alias": new_hashes()}
                if conn.execute(_NEW_ALIAS, swap).rowcount:
                    picked[row.token_hash] = (row.run_id, swap["b_alias"])
            return _found(conn, picked) if picked else []

    def forget_escalations(self) -> int:
        """Clear the due time of calls that will never be escalated (decided, or their
        suspension ended, before it came): how many. The reaper's pass, so the calls still
        to escalate stay few however many were decided in time."""
        with self.begin() as conn:
            return int(conn.execute(_VOID).rowcount or 0)

    def escalated_requests(self) -> list[tuple[str, str]]:
        """(owner, tool) of every escalated call still to decide: whom an inbox may list
        it for besides the owner's approvers."""
        with self.engine.connect() as conn:
            rows = conn.execute(_ESCALATED_OPEN).all()
        return sorted({(str(r.user_id), str(r.call.get("tool"))) for r in rows})

    def next_escalation_in(self, versions: Sequence[str] | None = None) -> float | None:
        """Seconds until the soonest call of a run of ``versions`` (None: any) still to
        escalate is due, by the database's clock (≤ 0: due now); None when no call waits
        to be escalated."""
        with self.engine.connect() as conn:
            value = conn.execute(_NEXT, served(versions)).scalar()
        return None if value is None else float(value)
