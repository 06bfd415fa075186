"""Every database operation on runs, one function per transaction.

Statements on the step path are built once at import and executed with bound parameters.
Every write to a running run is conditional on its lease (``owner`` and ``lease_epoch``)
and raises ``LeaseLost`` when the condition no longer holds; the transaction then rolls
back, so a fenced-out worker leaves nothing behind (invariant 8).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tether.budget import Limits
from tether.errors import LeaseLost
from tether.messages import pending_tool_calls
from tether.models.base import Message
from tether.runs import Lease, Pending, Run, RunState
from tether.store import pg_steps
from tether.store.engine import create_db_engine, db_now, is_sqlite
from tether.store.records import CallStatus, Decision, Event, LedgerEntry
from tether.store.schema import decisions, run_events, run_messages, runs, tool_calls

log = logging.getLogger(__name__)

RUNNING = RunState.RUNNING.value

_LEASE = sa.and_(
    runs.c.id == sa.bindparam("b_id"),
    runs.c.owner == sa.bindparam("b_owner"),
    runs.c.lease_epoch == sa.bindparam("b_epoch"),
    runs.c.state == RUNNING,
)

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

_TURN = (
    runs.update()
    .where(_LEASE)
    .values(
        step=runs.c.step + 1,
        steps=runs.c.steps + 1,
        spend_usd=runs.c.spend_usd + sa.bindparam("b_spend", type_=sa.Float),
        elapsed_ms=runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
        message_count=runs.c.message_count + 1,
        heartbeat_at=_FRESH_HEARTBEAT,
    )
    .returning(runs.c.message_count)
)

_TURN_FINAL = _TURN.values(state=RunState.ANSWERED.value, owner=None, updated_at=db_now())

_RESULT = (
    runs.update()
    .where(_LEASE)
    .values(
        tool_calls=runs.c.tool_calls + sa.bindparam("b_counted", type_=sa.Integer),
        elapsed_ms=runs.c.elapsed_ms + sa.bindparam("b_elapsed", type_=sa.BigInteger),
        message_count=runs.c.message_count + 1,
        heartbeat_at=_FRESH_HEARTBEAT,
    )
    .returning(runs.c.message_count)
)

# PostgreSQL: each step write as one statement (see ``pg_steps``), by shape.
_PG_TURN = {
    final: pg_steps.turn_statement(_TURN_FINAL if final else _TURN, final=final)
    for final in (False, True)
}
_PG_RESULT = {traced: pg_steps.result_statement(_RESULT, traced=traced) for traced in (False, True)}

_HEARTBEAT = runs.update().where(_LEASE).values(heartbeat_at=db_now())

_LEASE_HELD = sa.select(runs.c.id).where(_LEASE)

_INSERT_MESSAGE = run_messages.insert()

_INSERT_EVENT = run_events.insert().values(at=db_now())

_INSERT_INTENT = tool_calls.insert().values(status=CallStatus.INTENT.value, intent_at=db_now())

_RECORD_OUTCOME = (
    tool_calls.update()
    .where(
        tool_calls.c.idempotency_key == sa.bindparam("b_key"),
        tool_calls.c.status.in_([CallStatus.INTENT.value, CallStatus.UNKNOWN.value]),
    )
    .values(
        status=sa.bindparam("b_status"),
        result=sa.bindparam("b_result", type_=sa.JSON),
        outcome_at=db_now(),
    )
)

_SELECT_MESSAGES = (
    sa.select(run_messages.c.message)
    .where(run_messages.c.run_id == sa.bindparam("b_id"))
    .order_by(run_messages.c.seq)
)


@dataclass(frozen=True, kw_only=True)
class Intent:
    """A ledger intent to write with the assistant turn that asks for the call."""

    tool_call_id: str
    tool: str
    arguments: dict[str, Any]
    effect: str


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A run with everything the loop needs to go on: its messages, and the ledger entries
    and decisions of the calls of its last turn that still await a result."""

    run: Run
    messages: list[Message]
    ledger: dict[str, LedgerEntry]
    decisions: dict[str, Decision]


def idempotency_key(run_id: str, tool_call_id: str) -> str:
    """The key of a tool call, in the ledger and towards the tool's downstream (SPEC §3)."""
    return f"{run_id}:{tool_call_id}"


class Store:
    """The synchronous store. Each public method is one transaction; the engine's async API
    reaches each through one thread hop."""

    def __init__(self, url: str, *, heartbeat_refresh_s: float = 0.0) -> None:
        self.url = url
        self.engine: Engine = create_db_engine(url)
        # A step write refreshes a heartbeat older than this (a third of the timeout).
        self.heartbeat_refresh_s = heartbeat_refresh_s

    @property
    def sqlite(self) -> bool:
        return is_sqlite(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def now(self) -> float:
        """The database's clock, in epoch seconds."""
        with self.engine.connect() as conn:
            return float(conn.execute(sa.select(db_now())).scalar_one())

    # -- creating and claiming -------------------------------------------------------

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
        messages: Sequence[Message],
    ) -> Run:
        """Insert a new run, ready for a worker (running, no owner), with its first
        messages."""
        with self.engine.begin() as conn:
            row = conn.execute(
                runs.insert()
                .values(
                    id=run_id,
                    user_id=user_id,
                    question=question,
                    route=route,
                    state=RUNNING,
                    **limits.to_json(),
                    scope_snapshot=scope,
                    scope_resolved_at=db_now(),
                    versions=versions,
                    message_count=len(messages),
                    started_at=db_now(),
                    updated_at=db_now(),
                )
                .returning(runs)
            ).one()
            if messages:
                conn.execute(
                    _INSERT_MESSAGE,
                    [{"run_id": run_id, "seq": i, "message": m} for i, m in enumerate(messages)],
                )
            self._event(conn, run_id, "created", {"user_id": user_id, "limits": limits.to_json()})
            self._wake(conn)
            return Run.from_row(row._mapping)

    def claim_ready(self, owner: str, run_id: str | None = None) -> Run | None:
        """Take the lease of a run that waits for a worker (running, no owner): the given
        one, or the one waiting longest. None if there is none to take.

        Safe to race: the UPDATE is conditional on ``owner IS NULL``, and on PostgreSQL the
        candidate row is locked with SKIP LOCKED so concurrent workers pick different runs.
        """
        with self.engine.begin() as conn:
            if run_id is None:
                candidate = (
                    sa.select(runs.c.id)
                    .where(runs.c.state == RUNNING, runs.c.owner.is_(None))
                    .order_by(runs.c.updated_at)
                    .limit(1)
                )
                if not self.sqlite:
                    candidate = candidate.with_for_update(skip_locked=True)
                run_id = conn.execute(candidate).scalar()
                if run_id is None:
                    return None
            row = conn.execute(
                runs.update()
                .where(runs.c.id == run_id, runs.c.state == RUNNING, runs.c.owner.is_(None))
                .values(
                    owner=owner,
                    lease_epoch=runs.c.lease_epoch + 1,
                    heartbeat_at=db_now(),
                    updated_at=db_now(),
                )
                .returning(runs)
            ).first()
            return Run.from_row(row._mapping) if row else None

    # -- reading -----------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run | None:
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).first()
            return Run.from_row(row._mapping) if row else None

    def messages(self, run_id: str) -> list[Message]:
        with self.engine.begin() as conn:
            return [dict(m) for m in conn.execute(_SELECT_MESSAGES, {"b_id": run_id}).scalars()]

    def snapshot(self, run_id: str) -> Snapshot | None:
        """The run, its messages, and the ledger and decisions of its unanswered calls."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).first()
            if row is None:
                return None
            messages = [dict(m) for m in conn.execute(_SELECT_MESSAGES, {"b_id": run_id}).scalars()]
            call_ids = [call.id for call in pending_tool_calls(messages)]
            ledger: dict[str, LedgerEntry] = {}
            found: dict[str, Decision] = {}
            if call_ids:
                keys = [idempotency_key(run_id, cid) for cid in call_ids]
                for lrow in conn.execute(
                    sa.select(tool_calls).where(tool_calls.c.idempotency_key.in_(keys))
                ):
                    entry = LedgerEntry.from_row(lrow._mapping)
                    ledger[entry.tool_call_id] = entry
                # Only the decision that used the latest suspension's token counts: after a
                # `changed` re-suspension the earlier approval no longer applies.
                token_hash = row._mapping["pending_token_hash"]
                drow = conn.execute(
                    sa.select(decisions).where(decisions.c.token_hash == token_hash)
                ).first()
                if token_hash is not None and drow is not None:
                    decision = Decision.from_row(drow._mapping)
                    if decision.tool_call_id in call_ids:
                        found[decision.tool_call_id] = decision
            return Snapshot(
                run=Run.from_row(row._mapping), messages=messages, ledger=ledger, decisions=found
            )

    def list_runs(self, user_id: str | None = None, limit: int = 100) -> list[Run]:
        query = sa.select(runs).order_by(runs.c.started_at.desc(), runs.c.id).limit(limit)
        if user_id is not None:
            query = query.where(runs.c.user_id == user_id)
        with self.engine.begin() as conn:
            return [Run.from_row(r._mapping) for r in conn.execute(query)]

    def open_suspensions(self, limit: int) -> tuple[list[Run], float]:
        """Suspended runs still inside their approval window, soonest expiry first, and the
        database's clock they were judged by. Served by the partial index on suspended
        runs' ``expires_at``, so finished runs never weigh on it."""
        with self.engine.begin() as conn:
            now = float(conn.execute(sa.select(db_now())).scalar_one())
            query = (
                sa.select(runs)
                .where(runs.c.state == RunState.SUSPENDED.value, runs.c.expires_at > now)
                .order_by(runs.c.expires_at, runs.c.id)
                .limit(limit)
            )
            return [Run.from_row(r._mapping) for r in conn.execute(query)], now

    def events(self, run_id: str) -> list[Event]:
        query = sa.select(run_events).where(run_events.c.run_id == run_id).order_by(run_events.c.id)
        with self.engine.begin() as conn:
            return [Event.from_row(r._mapping) for r in conn.execute(query)]

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        query = (
            sa.select(tool_calls).where(tool_calls.c.run_id == run_id).order_by(tool_calls.c.seq)
        )
        with self.engine.begin() as conn:
            return [LedgerEntry.from_row(r._mapping) for r in conn.execute(query)]

    # -- the step writes (fenced) ------------------------------------------------------

    def persist_turn(
        self,
        lease: Lease,
        *,
        message: Message,
        spend_usd: float,
        elapsed_ms: int,
        intents: Sequence[Intent],
        final: bool,
        event: dict[str, Any],
    ) -> None:
        """The assistant turn with its spend, step count and the ledger intents of its tool
        calls, in one transaction: the turn *is* the intent. A final answer also moves the
        run to ``answered``."""
        keyed = [
            {
                "idempotency_key": idempotency_key(lease.run_id, i.tool_call_id),
                "tool_call_id": i.tool_call_id,
                "tool": i.tool,
                "arguments": i.arguments,
                "effect": i.effect,
            }
            for i in intents
        ]
        params = {
            "b_spend": spend_usd,
            "b_elapsed": elapsed_ms,
            "b_fresh": self.heartbeat_refresh_s,
        }
        with self.engine.begin() as conn:
            if not self.sqlite:
                self._fenced(
                    conn,
                    _PG_TURN[final],
                    lease,
                    **params,
                    b_message=message,
                    b_intents=keyed,
                    b_event=event,
                )
                return
            seq = self._fenced(conn, _TURN_FINAL if final else _TURN, lease, **params)
            conn.execute(_INSERT_MESSAGE, {"run_id": lease.run_id, "seq": seq, "message": message})
            if keyed:
                conn.execute(
                    _INSERT_INTENT, [{**k, "run_id": lease.run_id, "seq": seq} for k in keyed]
                )
            self._event(conn, lease.run_id, "answered" if final else "model_turn", event)

    def persist_tool_result(
        self,
        lease: Lease,
        *,
        tool_call_id: str,
        message: Message,
        status: CallStatus,
        summary: Any,
        elapsed_ms: int,
        counted: bool,
        event: dict[str, Any],
    ) -> None:
        """A tool's result message, its ledger outcome and the counters, in one
        transaction. Only a result that is not ``ok`` gets a trace event: a routine result
        is in the messages already."""
        traced = status is not CallStatus.OK
        params = {
            "b_counted": 1 if counted else 0,
            "b_elapsed": elapsed_ms,
            "b_fresh": self.heartbeat_refresh_s,
        }
        outcome = {
            "b_key": idempotency_key(lease.run_id, tool_call_id),
            "b_status": status.value,
            "b_result": summary,
        }
        with self.engine.begin() as conn:
            if not self.sqlite:
                self._fenced(
                    conn,
                    _PG_RESULT[traced],
                    lease,
                    **params,
                    **outcome,
                    b_message=message,
                    b_event=event,
                )
                return
            seq = self._fenced(conn, _RESULT, lease, **params)
            conn.execute(_INSERT_MESSAGE, {"run_id": lease.run_id, "seq": seq, "message": message})
            conn.execute(_RECORD_OUTCOME, outcome)
            if traced:
                self._event(conn, lease.run_id, "tool_result", event)

    def heartbeat(self, lease: Lease) -> bool:
        """Refresh the lease's heartbeat; False if the lease was lost."""
        with self.engine.begin() as conn:
            return conn.execute(_HEARTBEAT, _lease_params(lease)).rowcount == 1

    def lease_held(self, lease: Lease) -> bool:
        """Whether ``lease`` still owns the run (checked before a write tool runs)."""
        with self.engine.begin() as conn:
            return conn.execute(_LEASE_HELD, _lease_params(lease)).first() is not None

    # -- transitions out of running (fenced) -------------------------------------------

    def halt(self, lease: Lease, *, reason: str, elapsed_ms: int, event: dict[str, Any]) -> None:
        """running → halted with ``reason``; the run keeps its budget and messages."""
        self._leave_running(
            lease,
            RunState.HALTED,
            {"halt_reason": reason},
            elapsed_ms,
            "halted",
            {"reason": reason, **event},
        )

    def fail(
        self,
        lease: Lease,
        *,
        reason: str,
        elapsed_ms: int,
        event: dict[str, Any],
        unknown_call: str | None = None,
    ) -> None:
        """running → failed with ``reason``; kept with its ledger for a person to inspect.
        ``unknown_call`` names a call whose outcome could not be learnt: its ledger entry
        is recorded ``unknown`` in the same transaction."""
        unknown = None
        if unknown_call is not None:
            unknown = {
                "b_key": idempotency_key(lease.run_id, unknown_call),
                "b_status": CallStatus.UNKNOWN.value,
                "b_result": "unreconcilable",
            }
        self._leave_running(
            lease,
            RunState.FAILED,
            {"fail_reason": reason},
            elapsed_ms,
            "failed",
            {"reason": reason, **event},
            ledger_outcome=unknown,
        )

    def suspend(
        self,
        lease: Lease,
        *,
        pending: Pending,
        token_hash: str,
        ttl_s: float,
        elapsed_ms: int,
        event: dict[str, Any],
    ) -> float:
        """running → suspended on ``pending``; returns ``expires_at`` (DB clock + TTL)."""
        with self.engine.begin() as conn:
            row = conn.execute(
                runs.update()
                .where(_LEASE)
                .values(
                    state=RunState.SUSPENDED.value,
                    owner=None,
                    pending=pending.to_json(),
                    pending_token_hash=token_hash,
                    suspended_at=db_now(),
                    expires_at=db_now() + ttl_s,
                    notified_at=None,
                    elapsed_ms=runs.c.elapsed_ms + elapsed_ms,
                    updated_at=db_now(),
                )
                .returning(runs.c.expires_at),
                _lease_params(lease),
            ).first()
            if row is None:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            self._event(conn, lease.run_id, "suspended", event)
            return float(row[0])

    def release(
        self, lease: Lease, *, elapsed_ms: int, event: dict[str, Any] | None = None
    ) -> None:
        """Hand a running run back to the workers (owner cleared, state unchanged)."""
        with self.engine.begin() as conn:
            result = conn.execute(
                runs.update()
                .where(_LEASE)
                .values(owner=None, elapsed_ms=runs.c.elapsed_ms + elapsed_ms, updated_at=db_now()),
                _lease_params(lease),
            )
            if result.rowcount != 1:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            if event is not None:
                self._event(conn, lease.run_id, "released", event)
            self._wake(conn)

    def add_event(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        with self.engine.begin() as conn:
            self._event(conn, run_id, kind, data)

    # -- resumption paths --------------------------------------------------------------

    def find_by_token(self, token_hash: str) -> tuple[Run | None, Decision | None]:
        """The run suspended on this token (if any), and the decision that used it (if
        any). Uses the partial index on suspended runs' token hashes."""
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(runs).where(
                    runs.c.pending_token_hash == token_hash,
                    runs.c.state == RunState.SUSPENDED.value,
                )
            ).first()
            drow = conn.execute(
                sa.select(decisions).where(decisions.c.token_hash == token_hash)
            ).first()
            return (
                Run.from_row(row._mapping) if row else None,
                Decision.from_row(drow._mapping) if drow else None,
            )

    def decision_for_call(self, run_id: str, tool_call_id: str) -> Decision | None:
        """The latest decision taken on a call of a run, if any."""
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(decisions)
                .where(decisions.c.run_id == run_id, decisions.c.tool_call_id == tool_call_id)
                .order_by(decisions.c.decided_at.desc())
                .limit(1)
            ).first()
            return Decision.from_row(row._mapping) if row else None

    def claim_suspended(
        self, *, run_id: str, token_hash: str, owner: str, decision: str, approver: str
    ) -> Run | None:
        """The one claim of a suspension (invariant 5): suspended → running under
        ``owner``, conditional on the token and on ``expires_at`` against the database's
        clock, recording the decision, who and when in the same transaction. None if the
        token was used, expired or superseded meanwhile."""
        with self.engine.begin() as conn:
            row = conn.execute(
                runs.update()
                .where(
                    runs.c.id == run_id,
                    runs.c.state == RunState.SUSPENDED.value,
                    runs.c.pending_token_hash == token_hash,
                    runs.c.expires_at > db_now(),
                )
                .values(
                    state=RUNNING,
                    owner=owner,
                    lease_epoch=runs.c.lease_epoch + 1,
                    heartbeat_at=db_now(),
                    updated_at=db_now(),
                )
                .returning(runs)
            ).first()
            if row is None:
                return None
            run = Run.from_row(row._mapping)
            assert run.pending is not None
            conn.execute(
                decisions.insert().values(
                    token_hash=token_hash,
                    run_id=run_id,
                    tool_call_id=run.pending.tool_call_id,
                    decision=decision,
                    decided_by=approver,
                    decided_at=db_now(),
                    digest=run.pending.digest,
                )
            )
            self._event(
                conn,
                run_id,
                "decision",
                {"decision": decision, "by": approver, "tool_call_id": run.pending.tool_call_id},
            )
            return run

    def mark_notified(self, run_id: str, token_hash: str) -> None:
        """Record that the notice for this suspension's token was delivered."""
        with self.engine.begin() as conn:
            conn.execute(
                runs.update()
                .where(runs.c.id == run_id, runs.c.pending_token_hash == token_hash)
                .values(notified_at=db_now())
            )

    def reissue_unnotified(
        self, *, older_than_s: float, batch: int, new_hashes: Callable[[], str]
    ) -> list[tuple[Run, str]]:
        """Give suspended runs whose notice was never delivered a fresh token hash.

        Safe: the old token reached nobody (its notice was not delivered), the window
        (``expires_at``) is unchanged, and each swap is conditional on the old hash, so a
        concurrent reaper or approval cannot be overtaken. Returns (run, new hash) pairs.
        """
        out: list[tuple[Run, str]] = []
        with self.engine.begin() as conn:
            due = (
                sa.select(runs.c.id, runs.c.pending_token_hash)
                .where(
                    runs.c.state == RunState.SUSPENDED.value,
                    runs.c.notified_at.is_(None),
                    runs.c.suspended_at < db_now() - older_than_s,
                    runs.c.expires_at > db_now(),
                )
                .order_by(runs.c.suspended_at)
                .limit(batch)
            )
            if not self.sqlite:
                due = due.with_for_update(skip_locked=True)
            for run_id, old_hash in conn.execute(due).all():
                new_hash = new_hashes()
                row = conn.execute(
                    runs.update()
                    .where(
                        runs.c.id == run_id,
                        runs.c.state == RunState.SUSPENDED.value,
                        runs.c.pending_token_hash == old_hash,
                    )
                    .values(pending_token_hash=new_hash, suspended_at=db_now())
                    .returning(runs)
                ).first()
                if row is not None:
                    self._event(conn, run_id, "notice_reissued", {})
                    out.append((Run.from_row(row._mapping), new_hash))
        return out

    def claim_orphans(
        self, *, owner: str, stale_after_s: float, max_attempts: int, batch: int
    ) -> tuple[list[Run], list[str]]:
        """Take over runs whose owner's heartbeat is older than ``stale_after_s`` (database
        clock), oldest first. Each claim is one conditional UPDATE with a new lease epoch
        that counts the attempt; a run past ``max_attempts`` is failed instead
        (``recovery_exhausted``). Returns (claimed, exhausted ids).

        Safe to run concurrently: candidates are locked with SKIP LOCKED on PostgreSQL
        (SQLite serialises writers), and each UPDATE re-checks staleness.
        """
        stale = sa.and_(
            runs.c.state == RUNNING,
            runs.c.owner.is_not(None),
            runs.c.heartbeat_at < db_now() - stale_after_s,
        )
        claimed: list[Run] = []
        exhausted: list[str] = []
        with self.engine.begin() as conn:
            candidates = (
                sa.select(runs.c.id, runs.c.recovery_attempts)
                .where(stale)
                .order_by(runs.c.heartbeat_at)
                .limit(batch)
            )
            if not self.sqlite:
                candidates = candidates.with_for_update(skip_locked=True)
            for run_id, attempts in conn.execute(candidates).all():
                if attempts >= max_attempts:
                    result = conn.execute(
                        runs.update()
                        .where(runs.c.id == run_id, stale)
                        .values(
                            state=RunState.FAILED.value,
                            fail_reason="recovery_exhausted",
                            owner=None,
                            updated_at=db_now(),
                        )
                    )
                    if result.rowcount == 1:
                        exhausted.append(run_id)
                        self._event(
                            conn,
                            run_id,
                            "failed",
                            {"reason": "recovery_exhausted", "recovery_attempts": attempts},
                        )
                    continue
                row = conn.execute(
                    runs.update()
                    .where(runs.c.id == run_id, stale)
                    .values(
                        owner=owner,
                        lease_epoch=runs.c.lease_epoch + 1,
                        recovery_attempts=runs.c.recovery_attempts + 1,
                        heartbeat_at=db_now(),
                        updated_at=db_now(),
                    )
                    .returning(runs)
                ).first()
                if row is not None:
                    run = Run.from_row(row._mapping)
                    claimed.append(run)
                    self._event(
                        conn,
                        run_id,
                        "recovering",
                        {"recovery_attempts": run.recovery_attempts, "owner": owner},
                    )
        return claimed, exhausted

    def refresh_scope(self, lease: Lease, scope: dict[str, Any]) -> None:
        """Store the scope just re-resolved, with the database's time."""
        with self.engine.begin() as conn:
            result = conn.execute(
                runs.update()
                .where(_LEASE)
                .values(scope_snapshot=scope, scope_resolved_at=db_now()),
                _lease_params(lease),
            )
            if result.rowcount != 1:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)

    def continue_halted(
        self, *, run_id: str, user_id: str, limits: Limits, by: str, why: str | None
    ) -> Run | None:
        """halted → running (handed to the workers) with the granted ``limits``, logging
        the grant: who, why, the previous halt reason, the old and new limits. None if the
        run is not the user's halted run (the caller tells which)."""
        with self.engine.begin() as conn:
            before = conn.execute(
                sa.select(runs).where(
                    runs.c.id == run_id,
                    runs.c.user_id == user_id,
                    runs.c.state == RunState.HALTED.value,
                )
            ).first()
            if before is None:
                return None
            old = Run.from_row(before._mapping)
            row = conn.execute(
                runs.update()
                .where(runs.c.id == run_id, runs.c.state == RunState.HALTED.value)
                .values(
                    state=RUNNING,
                    owner=None,
                    halt_reason=None,
                    pending=None,
                    **limits.to_json(),
                    updated_at=db_now(),
                )
                .returning(runs)
            ).first()
            if row is None:
                return None
            self._event(
                conn,
                run_id,
                "continued",
                {
                    "by": by,
                    "why": why,
                    "previous_halt_reason": old.halt_reason,
                    "old_limits": old.limits.to_json(),
                    "new_limits": limits.to_json(),
                    "budget": old.budget.to_json(),
                },
            )
            self._wake(conn)
            return Run.from_row(row._mapping)

    def cancel(self, *, run_id: str, user_id: str, by: str) -> Run | None:
        """Any non-terminal state → cancelled. A live owner's next fenced write then fails,
        so it stops. None if the run is not the user's or is already terminal."""
        with self.engine.begin() as conn:
            row = conn.execute(
                runs.update()
                .where(
                    runs.c.id == run_id,
                    runs.c.user_id == user_id,
                    runs.c.state.in_([RUNNING, RunState.SUSPENDED.value, RunState.HALTED.value]),
                )
                .values(state=RunState.CANCELLED.value, owner=None, updated_at=db_now())
                .returning(runs)
            ).first()
            if row is None:
                return None
            self._event(conn, run_id, "cancelled", {"by": by})
            return Run.from_row(row._mapping)

    def expire_suspended(self, batch: int) -> list[str]:
        """suspended → halted (``suspension_expired``) for runs past their window, by the
        database's clock. Safe to race an approval: both are conditional UPDATEs on
        ``state = 'suspended'``, and the claim also checks ``expires_at``."""
        with self.engine.begin() as conn:
            due = (
                sa.select(runs.c.id)
                .where(runs.c.state == RunState.SUSPENDED.value, runs.c.expires_at <= db_now())
                .order_by(runs.c.expires_at)
                .limit(batch)
            )
            if not self.sqlite:
                due = due.with_for_update(skip_locked=True)
            ids = list(conn.execute(due).scalars())
            if not ids:
                return []
            expired = list(
                conn.execute(
                    runs.update()
                    .where(
                        runs.c.id.in_(ids),
                        runs.c.state == RunState.SUSPENDED.value,
                        runs.c.expires_at <= db_now(),
                    )
                    .values(
                        state=RunState.HALTED.value,
                        halt_reason="suspension_expired",
                        updated_at=db_now(),
                    )
                    .returning(runs.c.id)
                ).scalars()
            )
            for run_id in expired:
                self._event(conn, run_id, "halted", {"reason": "suspension_expired"})
            return expired

    def purge_retained(self, retention_s: float, batch: int) -> int:
        """Delete up to ``batch`` runs halted or finished more than ``retention_s`` ago,
        with their messages, events, ledger and decisions (ON DELETE CASCADE)."""
        with self.engine.begin() as conn:
            due = (
                sa.select(runs.c.id)
                .where(
                    runs.c.state.in_(["halted", "answered", "failed", "cancelled"]),
                    runs.c.updated_at < db_now() - retention_s,
                )
                .order_by(runs.c.updated_at)
                .limit(batch)
            )
            ids = list(conn.execute(due).scalars())
            if not ids:
                return 0
            for table in (run_messages, run_events, tool_calls, decisions):
                conn.execute(table.delete().where(table.c.run_id.in_(ids)))
            return int(conn.execute(runs.delete().where(runs.c.id.in_(ids))).rowcount)

    # -- helpers -----------------------------------------------------------------------

    def _leave_running(
        self,
        lease: Lease,
        state: RunState,
        values: dict[str, Any],
        elapsed_ms: int,
        kind: str,
        event: dict[str, Any],
        ledger_outcome: dict[str, Any] | None = None,
    ) -> None:
        with self.engine.begin() as conn:
            result = conn.execute(
                runs.update()
                .where(_LEASE)
                .values(
                    state=state.value,
                    owner=None,
                    elapsed_ms=runs.c.elapsed_ms + elapsed_ms,
                    updated_at=db_now(),
                    **values,
                ),
                _lease_params(lease),
            )
            if result.rowcount != 1:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            if ledger_outcome is not None:
                conn.execute(_RECORD_OUTCOME, ledger_outcome)
            self._event(conn, lease.run_id, kind, event)

    @staticmethod
    def _fenced(conn: Connection, stmt: Any, lease: Lease, **params: Any) -> int:
        """Run a lease-conditional UPDATE … RETURNING message_count; the new message's seq."""
        row = conn.execute(stmt, {**_lease_params(lease), **params}).first()
        if row is None:
            raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
        return int(row[0]) - 1

    def _wake(self, conn: Connection) -> None:
        """Wake idle workers on PostgreSQL: a run became ready. Sent at commit, so a worker
        never wakes for a run it cannot see yet."""
        if not self.sqlite:
            conn.exec_driver_sql("SELECT pg_notify('tether_runs', '')")

    @staticmethod
    def _event(conn: Connection, run_id: str, kind: str, data: dict[str, Any]) -> None:
        conn.execute(_INSERT_EVENT, {"run_id": run_id, "kind": kind, "data": data})


def _lease_params(lease: Lease) -> dict[str, Any]:
    return {"b_id": lease.run_id, "b_owner": lease.owner, "b_epoch": lease.epoch}


def chunks(items: Iterable[str], size: int) -> list[list[str]]:
    """Split ``items`` into lists of at most ``size``."""
    out: list[list[str]] = []
    for item in items:
        if not out or len(out[-1]) >= size:
            out.append([])
        out[-1].append(item)
    return out
