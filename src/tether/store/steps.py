"""The fenced writes of a running run: its steps, its heartbeat, and leaving ``running``.

Each method is one transaction conditional on the lease: when another owner took the
run, nothing is written and ``LeaseLost`` is raised (invariant 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from tether.budget import TreeNode
from tether.errors import LeaseLost
from tether.models.base import Message
from tether.reasons import FailReason, HaltReason
from tether.runs import Lease, Pending, RunState, iso
from tether.store.backend import faults
from tether.store.base import StoreBase
from tether.store.records import CallStatus
from tether.store.sql.sealed import sealed_result, sealed_turn
from tether.store.sql.steps import (
    FAIL,
    HALT,
    HAND_OVER,
    HEARTBEAT,
    HEARTBEATS,
    INSERT_MESSAGE,
    LANDED,
    LEASE_HELD,
    MODEL_RETRY,
    OPENING,
    RECORD_EDIT,
    RECORD_OUTCOME,
    REFRESH_SCOPE,
    RELEASE,
    SUSPEND,
    add_event,
    lease_params,
)
from tether.store.sql.transitions import Transition
from tether.store.suspensions import write_calls
from tether.store.trees import halted, step_over, stopped


@dataclass(frozen=True, kw_only=True)
class Intent:
    """A ledger entry to write with the assistant turn that asks for the call: an intent,
    or, for a call of a read-only step (run before its turn is written), its outcome."""

    tool_call_id: str
    tool: str
    arguments: dict[str, Any]
    effect: str
    status: CallStatus = CallStatus.INTENT


# The ledger's result of a call whose outcome could not be learnt (no result reached the
# model): shaped as the error results the model sees.
UNRECONCILABLE = {
    "error": FailReason.UNRECONCILABLE.value,
    "message": "whether this call took effect could not be learnt; a person must look",
}


# The most leases one heartbeat statement refreshes.
HEARTBEAT_CHUNK = 500


def idempotency_key(run_id: str, tool_call_id: str) -> str:
    """The key of a tool call, in the ledger and towards the tool's downstream (reference §3)."""
    return f"{run_id}:{tool_call_id}"


def _ledger_row(lease: Lease, intent: Intent) -> dict[str, Any]:
    """The ledger entry a turn stores for one of its calls: an intent, or a read-only
    step's outcome; its result is the call's result message (``Reads.ledger``)."""
    return {
        "idempotency_key": idempotency_key(lease.run_id, intent.tool_call_id),
        "tool_call_id": intent.tool_call_id,
        "tool": intent.tool,
        "arguments": intent.arguments,
        "effect": intent.effect,
        "status": intent.status.value,
        "result": None,
        "done": intent.status is not CallStatus.INTENT,
    }


def _lost(lease: Lease) -> LeaseLost:
    return LeaseLost("this worker no longer owns the run", run_id=lease.run_id)


class Steps(StoreBase):
    """Step writes and the transitions out of ``running``, each fenced by the lease."""

    @faults.idempotent
    def persist_turn(
        self,
        lease: Lease,
        *,
        seq: int,
        message: Message,
        spend_usd: float,
        elapsed_ms: int,
        intents: Sequence[Intent],
        final: bool,
        event: dict[str, Any],
        results: Sequence[Message] = (),
        counted: int = 0,
        result_events: Sequence[dict[str, Any]] = (),
        output: Any = None,
        events: Sequence[tuple[str, dict[str, Any]]] = (),
        input_tokens: int = 0,
        tree_root: str | None = None,
        tree_chain: Sequence[str] | None = None,
    ) -> list[TreeNode] | None:
        """The assistant turn with its spend, step count and the ledger intents of its tool
        calls, in one transaction: the turn *is* the intent. A final answer also moves the
        run to ``answered`` and stores its validated typed ``output``. A read-only step
        passes its calls' ``results`` too (their ledger entries then carry the outcome,
        ``counted`` of them ran, and ``result_events`` trace each of them as
        ``tool_result``): one commit for the step. A rejected answer passes the feedback
        to the model as a result, and its ``output_invalid`` in ``events`` (kind, data).
        ``input_tokens``: what the model call reported (the trigger of compaction).
        ``tree_root``: its tree's root (reference §18: ``StepRefused`` past its limits),
        ``tree_chain`` the run and its ancestors if known; the tree's figures are returned.

        ``seq`` is the run's message count as the writer knows it: idempotent, so a try
        after a COMMIT that was cut off finds the first try's turn and does nothing."""
        keyed = [_ledger_row(lease, i) for i in intents]
        messages = [message, *results]
        params = {
            **lease_params(lease),
            "b_seq": seq,
            "b_added": len(messages),
            "b_counted": counted,
            "b_spend": spend_usd,
            "b_elapsed": elapsed_ms,
            "b_fresh": self.heartbeat_refresh_s,
            "b_output": output,
            "b_input": input_tokens,
        }
        # Every stored turn has its ``model_turn`` (with its text, reference §16); a final
        # answer's is followed by ``answered``.
        answered = [("answered", {"step": event.get("step")})] if final else []
        traced = [("model_turn", event), *answered]
        traced += [*(("tool_result", e) for e in result_events), *events]
        # Sealed (reference §20) before the transaction, so the work never holds its locks.
        params, stored, keyed, traced = sealed_turn(self.keyring, params, messages, keyed, traced)
        try:
            with self.begin() as conn:
                self.dialect.write_turn(
                    conn, params, final=final, messages=stored, intents=keyed, events=traced
                )
                return self._in_tree(conn, lease.run_id, tree_root, tree_chain, final=final)
        except LeaseLost:
            if not self._landed(lease, seq, message):
                raise
            return None

    @faults.idempotent
    def persist_tool_result(
        self,
        lease: Lease,
        *,
        seq: int,
        tool_call_id: str,
        message: Message,
        status: CallStatus,
        elapsed_ms: int,
        counted: bool,
        event: dict[str, Any],
    ) -> None:
        """A tool's result message, its ledger outcome (``status``; the result itself is
        the message's, never copied into the ledger), the counters and its ``tool_result``
        event, in one transaction: every result is traced, ``ok`` ones included, so a
        stream client sees whether a call ran (an approved write as any other).
        Idempotent by ``seq``, as ``persist_turn``."""
        params = {
            **lease_params(lease),
            "b_seq": seq,
            "b_counted": 1 if counted else 0,
            "b_elapsed": elapsed_ms,
            "b_fresh": self.heartbeat_refresh_s,
            "b_key": idempotency_key(lease.run_id, tool_call_id),
            "b_status": status.value,
            "b_result": None,
        }
        params, stored, sealed_event = sealed_result(self.keyring, params, message, event)
        try:
            with self.begin() as conn:
                self.dialect.write_result(conn, params, message=stored, event=sealed_event)
        except LeaseLost:
            if not self._landed(lease, seq, message):
                raise

    @faults.idempotent
    def open_follow_up(
        self, lease: Lease, *, messages: Sequence[Message], event: dict[str, Any]
    ) -> None:
        """A follow-up's first messages (the ``not_executed`` results it gives the calls
        its thread left without one, then its question) and its ``follow_up`` event, in
        one transaction, at message count 0. Idempotent as ``persist_turn``."""
        params = {
            **lease_params(lease),
            "b_seq": 0,
            "b_added": len(messages),
            "b_fresh": self.heartbeat_refresh_s,
        }
        try:
            with self.begin() as conn:
                if conn.execute(OPENING, params).first() is None:
                    raise _lost(lease)
                conn.execute(
                    INSERT_MESSAGE,
                    [
                        {"run_id": lease.run_id, "seq": i, "message": m}
                        for i, m in enumerate(messages)
                    ],
                )
                add_event(conn, lease.run_id, "follow_up", event)
        except LeaseLost:
            if not self._landed(lease, 0, messages[0]):
                raise

    def _in_tree(
        self,
        conn: Connection,
        run_id: str,
        tree_root: str | None,
        chain: Sequence[str] | None,
        *,
        final: bool,
    ) -> list[TreeNode] | None:
        """What a stored turn means in a tree (reference §18), in its transaction: past an
        ancestor's limit it is rolled back (``StepRefused``); a final answer tells the
        parent, if any, which may go on. The tree's figures, in a tree."""
        nodes = (
            None if tree_root is None else step_over(conn, self.dialect, run_id, tree_root, chain)
        )
        if final:
            stopped(conn, self.dialect, [run_id], RunState.ANSWERED.value)
        return nodes

    def _landed(self, lease: Lease, seq: int, message: Message) -> bool:
        """Whether a step write that matched no row had landed already: its message is at
        ``seq`` and the lease still holds (or the run answered). A write tried again after
        its COMMIT was cut off lands here; a writer that lost its lease does not."""
        with self.begin() as conn:
            stored = conn.execute(LANDED, {**lease_params(lease), "b_seq": seq}).scalar()
        return stored is not None and stored == message

    def hand_over(self, lease: Lease, *, elapsed_ms: int, event: dict[str, Any]) -> None:
        """Let go of a running run for the next reaper pass to recover (reconciling its
        call first, invariant 3): still running under this lease, whose heartbeat is made
        stale now; traced as ``reconciling`` (``event``). ``LeaseLost`` if not held."""
        with self.begin() as conn:
            params = {**lease_params(lease), "b_elapsed": elapsed_ms}
            if conn.execute(HAND_OVER, params).rowcount != 1:
                raise _lost(lease)
            add_event(conn, lease.run_id, "reconciling", event)

    def heartbeat(self, lease: Lease) -> bool:
        """Refresh the lease's heartbeat; False if the lease was lost."""
        with self.begin() as conn:
            return conn.execute(HEARTBEAT, lease_params(lease)).rowcount == 1

    def heartbeat_many(self, leases: Sequence[Lease]) -> list[bool]:
        """Refresh the heartbeat of every lease in one transaction, a statement for each
        ``HEARTBEAT_CHUNK`` of them (a thousand runs in flight are a few round trips, and
        their rows are locked for as long, not a round trip each); for each, whether it
        is still held (False: another owner took the run)."""
        held: set[tuple[str, str, int]] = set()
        with self.begin() as conn:
            for at in range(0, len(leases), HEARTBEAT_CHUNK):
                chunk = leases[at : at + HEARTBEAT_CHUNK]
                params = {
                    "b_ids": [lease.run_id for lease in chunk],
                    "b_leases": [(lease.run_id, lease.owner, lease.epoch) for lease in chunk],
                }
                held.update(tuple(row) for row in conn.execute(HEARTBEATS, params))
        return [(lease.run_id, lease.owner, lease.epoch) in held for lease in leases]

    def lease_held(self, lease: Lease) -> bool:
        """Whether ``lease`` still owns the run (checked before a write tool runs): one
        read, outside any write transaction (its step's writes are fenced anyway)."""
        with self.reading() as conn:
            return conn.execute(LEASE_HELD, lease_params(lease)).first() is not None

    def record_edit(self, lease: Lease, *, tool_call_id: str, arguments: dict[str, Any]) -> None:
        """Record in the ledger the arguments an approver edited a call to, before it runs
        with them (reference §9). Fenced by the lease; safe twice (it sets the same value)."""
        params = {**lease_params(lease), "b_key": idempotency_key(lease.run_id, tool_call_id)}
        with self.begin() as conn:
            if conn.execute(LEASE_HELD, lease_params(lease)).first() is None:
                raise _lost(lease)
            conn.execute(RECORD_EDIT, {**params, "b_args": arguments})

    def refresh_scope(self, lease: Lease, scope: dict[str, Any]) -> None:
        """Store the scope just re-resolved, with the database's time."""
        with self.begin() as conn:
            result = conn.execute(REFRESH_SCOPE, {**lease_params(lease), "b_scope": scope})
            if result.rowcount != 1:
                raise _lost(lease)

    def add_event(self, lease: Lease, kind: str, data: dict[str, Any]) -> None:
        """Append one entry to the trace of a run ``lease`` holds (under the run's row lock,
        like every other event, so a concurrent writer of the run's events commits before
        or after it). Fenced like every write of an owner: one that lost the run writes
        nothing into the new owner's trace (``LeaseLost``)."""
        with self.begin() as conn:
            if conn.execute(self.dialect.lock(LEASE_HELD), lease_params(lease)).first() is None:
                raise _lost(lease)
            add_event(conn, lease.run_id, kind, data)

    # -- transitions out of running (fenced) -----------------------------------------------

    def halt(
        self,
        lease: Lease,
        *,
        reason: HaltReason,
        elapsed_ms: int,
        event: dict[str, Any],
        halted_by: str | None = None,
        spend_usd: float = 0.0,
    ) -> None:
        """running → halted with ``reason``; the run keeps its budget and messages. A halt
        on a budget names the run whose limits stopped it (``halted_by``: its own id, or
        an ancestor's, reference §18); its parent, if any, hears of it. ``spend_usd``: a model
        call's cost not recorded yet (its step was refused)."""
        stored = HaltReason(reason).value
        with self.begin() as conn:
            self._leave(
                conn,
                HALT,
                lease,
                elapsed_ms,
                b_reason=stored,
                b_halted_by=halted_by,
                b_spend=spend_usd,
            )
            data = {"reason": stored, **event}
            if halted_by is not None:
                data["halted_by"] = halted_by
            add_event(conn, lease.run_id, "halted", data)
            halted(conn, lease.run_id, stored, halted_by)

    def fail(
        self,
        lease: Lease,
        *,
        reason: FailReason,
        elapsed_ms: int,
        event: dict[str, Any],
        unknown_call: str | None = None,
    ) -> None:
        """running → failed with ``reason``; kept with its ledger for a person to inspect.
        ``unknown_call`` names a call whose outcome could not be learnt: its ledger entry
        is recorded ``unknown`` in the same transaction."""
        stored = FailReason(reason).value
        with self.begin() as conn:
            self._leave(conn, FAIL, lease, elapsed_ms, b_reason=stored)
            if unknown_call is not None:
                outcome = {
                    "b_key": idempotency_key(lease.run_id, unknown_call),
                    "b_status": CallStatus.UNKNOWN.value,
                    "b_result": UNRECONCILABLE,
                }
                conn.execute(RECORD_OUTCOME, outcome)
            add_event(conn, lease.run_id, "failed", {"reason": stored, **event})
            stopped(conn, self.dialect, [lease.run_id], RunState.FAILED.value)

    def suspend(
        self,
        lease: Lease,
        *,
        calls: Sequence[tuple[Pending, str]],
        ttl_s: float,
        elapsed_ms: int,
        event: dict[str, Any],
        keep: Sequence[str] = (),
    ) -> float:
        """running → suspended on ``calls`` (each pending call with its token's hash, in
        call order; ``pending`` is the first), every one undecided; the calls in ``keep``
        (decided, not carried out yet) keep their decisions. Returns ``expires_at`` (DB
        clock + TTL): the whole suspension expires at once (reference §15)."""
        first, first_hash = calls[0]
        with self.begin() as conn:
            row = self._leave(
                conn,
                SUSPEND,
                lease,
                elapsed_ms,
                b_pending=first.to_json(),
                b_token_hash=first_hash,
                b_undecided=len(calls),
                b_ttl=ttl_s,
            )
            write_calls(conn, lease, calls, keep)
            add_event(conn, lease.run_id, "suspended", event)
            return float(row[0])

    def release(
        self,
        lease: Lease,
        *,
        elapsed_ms: int,
        event: dict[str, Any] | None = None,
        delay_s: float = 0.0,
        kind: str = "released",
    ) -> None:
        """Hand a running run back to the workers (owner cleared, state unchanged). With
        ``delay_s`` > 0 no worker can claim it before the database's clock + ``delay_s``
        (a retry's backoff); ``event``, if given, is traced as ``kind``."""
        with self.begin() as conn:
            self._leave(conn, RELEASE, lease, elapsed_ms, b_delay=max(0.0, delay_s))
            if event is not None:
                add_event(conn, lease.run_id, kind, event)
            if delay_s <= 0:
                # A delayed run is not claimable yet: waking workers now would be useless.
                self.dialect.wake(conn)

    def retry_model(
        self, lease: Lease, *, elapsed_ms: int, delay_s: float, event: dict[str, Any]
    ) -> tuple[int, float]:
        """Hand a running run back after a model call that failed transiently: owner
        cleared, one more consecutive model failure counted, claimable no sooner than the
        database's clock + ``delay_s``; traced as ``model_retry`` with ``attempt`` (the new
        count) and ``retry_at``. Returns both (the count, ``ready_at``)."""
        with self.begin() as conn:
            row = self._leave(conn, MODEL_RETRY, lease, elapsed_ms, b_delay=delay_s)
            attempt, ready_at = int(row[0]), float(row[1])
            data = {"attempt": attempt, **event, "retry_at": iso(ready_at)}
            add_event(conn, lease.run_id, "model_retry", data)
        return attempt, ready_at

    @staticmethod
    def _leave(
        conn: Connection, transition: Transition, lease: Lease, elapsed_ms: int, **params: Any
    ) -> Any:
        """Apply a fenced transition out of running; ``LeaseLost`` if it did not apply."""
        row = transition.one(conn, {**lease_params(lease), "b_elapsed": elapsed_ms, **params})
        if row is None:
            raise _lost(lease)
        return row
