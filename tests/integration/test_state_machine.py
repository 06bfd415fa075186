"""The run state machine against the real store, on SQLite and on PostgreSQL.

Hypothesis drives random interleavings of what happens to runs: created, claimed, written
by their owner (assistant turns with tool-call intents, tool results), suspended (with a
window, or with a TTL of 0 so it is expired at once) on one to three calls of a turn,
each with its own token, decided call by call by concurrent approvers (the decision that
takes the last undecided call claims the run, reference §15), crashed, reaped, expired,
continued, cancelled, purged, and written by owners whose lease is stale. A model says
what each run must be; after every step the store must agree with it, and the invariants
of reference §2 that the store is responsible for must hold against what was observed
before (legal transitions, terminal states final, append-only messages, a budget that
only grows, fencing, one decision per token, bounded recovery, expiry, purge). A write
that must be refused must also leave every table exactly as it was.

Function-scoped fixtures are not reset between hypothesis examples, so each example clones
its own database from the session's templates and drops it in teardown.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from store_runs import stored_heads, stored_load, true_heads, true_load
from waiting import poll_until

from tether.budget import Budget, Limits
from tether.errors import LeaseLost
from tether.models.base import Message
from tether.reasons import FailReason, HaltReason
from tether.runs import (
    TERMINAL,
    Lease,
    Pending,
    Run,
    RunState,
    can_transition,
)
from tether.store import CallStatus, Intent, Store
from tether.store.claims import SuspensionClaim
from tether.store.records import Decision
from tether.store.sql.schema import decisions, run_events, run_messages, runs, tool_calls

PG_ADMIN_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite", "postgresql"]
MEMORY = Path("/dev/shm")

# Sized so that the file takes well under 40 s on a 2-core machine, both backends: an
# example costs a fresh database (about 0.2 to 0.7 s on PostgreSQL, a file copy on SQLite)
# and then a few milliseconds a step (more with a race), so fewer, longer examples: a
# suspension's calls are decided, expire or are re-issued over several steps.
# Derandomized, so CI runs the same examples each time.
EXAMPLES = {"sqlite": 30, "postgresql": 15}
SETTINGS = settings(
    stateful_step_count=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

RUNNING, SUSPENDED, HALTED = RunState.RUNNING, RunState.SUSPENDED, RunState.HALTED
ANSWERED, FAILED, CANCELLED = RunState.ANSWERED, RunState.FAILED, RunState.CANCELLED
OPEN = (CallStatus.INTENT, CallStatus.UNKNOWN)  # a call still waiting for its outcome
USERS = ("dana", "miguel")
# Few owner names, reused: fencing must tell leases apart by epoch, not by name alone.
WORKERS = ("w1", "w2")
REAPERS = ("r1", "r2")
WINDOW_S = 3600.0  # an approval window that passes during an example only by close_a_window
MAX_RUNS = 4  # unfinished runs at once
PICK = st.integers(min_value=0, max_value=1 << 16)
HALTS = [r for r in HaltReason if r is not HaltReason.SUSPENSION_EXPIRED]
LEAVES = ("halt", "fail", "fail_unknown", "release", "release_later")
STALE_OPS = ("turn", "answer", "result", "suspend", "heartbeat", "scope", *LEAVES)
# A vote on a call of a suspension: which call (its index, modulo the calls), how, by whom.
VOTE = st.tuples(
    st.integers(min_value=0, max_value=2),
    st.sampled_from(["approve", "decline"]),
    st.sampled_from(USERS),
)
EXPIRED = HaltReason.SUSPENSION_EXPIRED.value
TABLES = (runs, run_messages, run_events, tool_calls, decisions)

T = TypeVar("T")


def _pick(items: Sequence[T], index: int) -> T:
    return items[index % len(items)]


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


class FreshDatabase:
    """A migrated database for one example, cloned from the session's template."""

    def __init__(self, backend: str, templates: dict[str, str], folder: Path, n: int) -> None:
        self.backend = backend
        self.name = f"tether_sm_{os.getpid()}_{n}"
        self.path = folder / f"{self.name}.db"
        if backend == "sqlite":
            shutil.copyfile(templates["sqlite"], self.path)
            self.url = f"sqlite:///{self.path}"
        else:
            _admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
            _admin(f"CREATE DATABASE {self.name} TEMPLATE {templates['postgresql']}")
            self.url = f"{PG_ADMIN_URL.rpartition('/')[0]}/{self.name}"

    def drop(self) -> None:
        if self.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        else:
            _admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


@dataclass
class Asked:
    """One call of a run's suspension, as the model knows it."""

    call: str
    token: str  # its token's hash (a re-issued notice gives it a new one)
    decision: tuple[str, str] | None = None  # (decision, by) once one is recorded
    notified: bool = False  # its notice was delivered (so its token is never re-issued)


@dataclass
class Expected:
    """What the model says one run is."""

    id: str
    user: str
    messages: list[Message]
    limits: Limits
    state: RunState = RUNNING
    budget: Budget = field(default_factory=Budget)
    owner: str | None = None
    epoch: int = 0
    delayed: bool = False  # handed back with a delay that cannot pass during an example
    token: str | None = None  # its first call's token hash, of the current (or last) suspension
    window_open: bool = False  # that suspension's TTL was not 0
    # The calls of that suspension, in call order, while their rows are kept (a halted run
    # continued forgets them).
    asked: list[Asked] = field(default_factory=list)
    undecided: int = 0  # how many of them have no decision yet
    halt_reason: str | None = None
    fail_reason: str | None = None
    recovery_attempts: int = 0
    ledger: dict[str, tuple[int, CallStatus]] = field(default_factory=dict)
    calls: int = 0  # tool call ids handed out so far

    def holds(self, lease: Lease) -> bool:
        """Whether ``lease`` is the run's current lease (the only one that may write)."""
        return (
            self.state is RUNNING
            and (self.owner, self.epoch) == (lease.owner, lease.epoch)
            and self.id == lease.run_id
        )

    def open_calls(self) -> list[str]:
        return [call for call, (_, status) in self.ledger.items() if status in OPEN]

    def done_calls(self) -> list[str]:
        return [call for call, (_, status) in self.ledger.items() if status not in OPEN]

    def tokens(self) -> list[str]:
        """The tokens of the calls of its current (or last) suspension."""
        return [a.token for a in self.asked]

    def intents(self) -> list[str]:
        return [call for call, (_, s) in self.ledger.items() if s is CallStatus.INTENT]

    def spent(self, *, steps: int = 0, spend: float = 0.0, calls: int = 0, ms: int = 0) -> None:
        b = self.budget
        self.budget = replace(
            b,
            steps=b.steps + steps,
            spend_usd=b.spend_usd + spend,
            tool_calls=b.tool_calls + calls,
            elapsed_ms=b.elapsed_ms + ms,
        )


@dataclass(frozen=True)
class Seen:
    """What the last check observed of a run: later observations must extend it."""

    state: RunState
    messages: list[Message]
    budget: Budget
    epoch: int
    recovery_attempts: int
    ledger: dict[str, CallStatus]


class RunMachine(RuleBasedStateMachine):
    """Random interleavings of everything that happens to runs, against one real store."""

    examples = 0

    def __init__(self, backend: str, templates: dict[str, str], folder: Path) -> None:
        super().__init__()
        self.where = (backend, templates, folder)
        # Made on first use: hypothesis tries many examples that end before any rule.
        self.db: FreshDatabase | None = None
        self._store: Store | None = None
        self.max_attempts = 2
        self.runs: dict[str, Expected] = {}
        self.purged: list[str] = []
        self.issued: list[Lease] = []  # every lease ever granted
        self.held: list[Lease] = []  # leases whose (live) owners believe they hold them
        self.tokens: dict[str, str] = {}  # every token hash issued → its run
        self.used: dict[str, tuple[str, str, str]] = {}  # token hash → (run, decision, by)
        self.seen: dict[str, Seen] = {}
        self.counter = 0

    @property
    def store(self) -> Store:
        if self._store is None:
            RunMachine.examples += 1
            self.db = FreshDatabase(*self.where, RunMachine.examples)
            self._store = Store(self.db.url)
        return self._store

    def teardown(self) -> None:
        if self._store is not None:
            self._store.close()
        if self.db is not None:
            self.db.drop()

    # -- helpers ------------------------------------------------------------------------------

    def _next(self, prefix: str) -> str:
        """A name unique in the example, the same when hypothesis replays it."""
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def _in(self, *states: RunState) -> list[Expected]:
        return [run for run in self.runs.values() if run.state in states]

    def _all_ids(self) -> list[str]:
        """Every run id the example made (purged ones too) and one never made."""
        return [*self.runs, *self.purged, "never-made"]

    def _current(self, lease: Lease) -> bool:
        run = self.runs.get(lease.run_id)
        return run is not None and run.holds(lease)

    def _owner_of(self, run_id: str) -> str | None:
        run = self.runs.get(run_id)
        return run.owner if run is not None else None

    def _stale(self) -> list[Lease]:
        return [lease for lease in self.issued if not self._current(lease)]

    def _owner_lease(self, pick: int) -> Lease:
        """A lease a live owner holds: one still current if there is any (an owner whose
        lease was taken learns it at its next write)."""
        current = [lease for lease in self.held if self._current(lease)]
        return _pick(current or self.held, pick)

    def _calls(self, lease: Lease, which: Callable[[Expected], list[str]]) -> list[str]:
        run = self.runs.get(lease.run_id)
        return which(run) if run is not None else []

    def _clock_past(self, moment: float) -> None:
        """Wait (at most a tick of the clock) until the database's clock is past
        ``moment``, so that what is judged against it does not depend on timing."""
        poll_until(lambda: self.store.now() > moment, interval=0.001, what="the DB clock")

    def _let_go(self, lease: Lease) -> None:
        if lease in self.held:
            self.held.remove(lease)

    def _dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table of runs, in key order."""
        with self.store.engine.connect() as conn:
            return {
                table.name: [
                    tuple(row)
                    for row in conn.execute(sa.select(table).order_by(*table.primary_key.columns))
                ]
                for table in TABLES
            }

    def _granted(self, run: Run, owner: str) -> Lease:
        """A claim gave ``owner`` the run: a new lease epoch, and the owner holds it."""
        exp = self.runs[run.id]
        assert (run.state, run.owner) == (RUNNING, owner)
        assert run.lease_epoch == exp.epoch + 1
        exp.state, exp.owner, exp.epoch, exp.delayed = RUNNING, owner, run.lease_epoch, False
        before = [lease for lease in self.issued if lease.run_id == run.id]
        lease = run.lease()
        self.issued.append(lease)
        self.held.append(lease)
        if before:  # the lease this one superseded is fenced out at once, same owner or not
            self._turn(before[-1], 1, False, 0.5, 3)
        return lease

    def _seq(self, lease: Lease) -> int:
        """The message count the writer of ``lease`` knows (the model's)."""
        run = self.runs.get(lease.run_id)
        return len(run.messages) if run is not None else 0

    def _fenced(self, lease: Lease, write: Callable[[], object]) -> Expected | None:
        """An owner's write: the run's model if it applied. A lease that is not the run's
        current one is refused with ``LeaseLost`` and nothing changes anywhere
        (invariant 8)."""
        run = self.runs.get(lease.run_id)
        if run is not None and run.holds(lease):
            write()
            return run
        before = self._dump()
        with pytest.raises(LeaseLost):
            write()
        # Nor can it keep the run alive, nor be told it still holds it.
        assert not self.store.heartbeat(lease) and not self.store.lease_held(lease)
        assert self._dump() == before
        self._let_go(lease)
        return None

    def _claim(
        self, run: Expected, asked: Asked, owner: str, decision: str, by: str
    ) -> SuspensionClaim:
        """A decision on one call of a suspension by its token (``claim_decision``, as
        the approvals path sends it)."""
        return self.store.claim_decision(
            run_id=run.id, token_hash=asked.token, owner=owner, decision=decision, approver=by
        )

    def _told(self, told: Decision | None, token: str) -> None:
        """A decision that lost, or a look-up of a token, is told the decision that used
        the token (if any, and for as long as its run is kept)."""
        used = self.used.get(token)
        if used is None or used[0] not in self.runs:
            assert told is None
        else:
            assert told is not None and (told.run_id, told.decision, told.by) == used

    def _race(self, calls: Sequence[Callable[[], object]]) -> list[object]:
        """Run the calls at once, each in its own thread, released together."""
        barrier = threading.Barrier(len(calls))

        def go(call: Callable[[], object]) -> object:
            barrier.wait(timeout=30)
            return call()

        with ThreadPoolExecutor(len(calls)) as pool:
            return list(pool.map(go, calls))

    # -- what an owner writes (each fenced by its lease) --------------------------------------

    def _turn(self, lease: Lease, calls: int, final: bool, spend: float, ms: int) -> None:
        run = self.runs.get(lease.run_id)
        first = run.calls if run is not None else 0
        ids = [f"call-{first + n}" for n in range(calls)]
        final = final and not ids
        message: Message = {"role": "assistant", "content": f"turn {self._next('t')}"}
        if ids:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": "send", "arguments": "{}"}}
                for i in ids
            ]
        intents = [
            Intent(tool_call_id=i, tool="send", arguments={"n": n}, effect="write")
            for n, i in enumerate(ids)
        ]
        applied = self._fenced(
            lease,
            lambda: self.store.persist_turn(
                lease,
                seq=self._seq(lease),
                message=message,
                spend_usd=spend,
                elapsed_ms=ms,
                intents=intents,
                final=final,
                event={"calls": ids},
            ),
        )
        if applied is None:
            return
        applied.messages.append(message)
        applied.calls += calls
        applied.spent(steps=1, spend=spend, ms=ms)
        for i in ids:
            applied.ledger[i] = (len(applied.messages) - 1, CallStatus.INTENT)
        if final:
            applied.state, applied.owner = ANSWERED, None
            self._let_go(lease)

    def _result(self, lease: Lease, call: str, status: CallStatus, counted: bool, ms: int) -> None:
        message: Message = {"role": "tool", "tool_call_id": call, "content": status.value}
        applied = self._fenced(
            lease,
            lambda: self.store.persist_tool_result(
                lease,
                seq=self._seq(lease),
                tool_call_id=call,
                message=message,
                status=status,
                elapsed_ms=ms,
                counted=counted,
                event={"call": call},
            ),
        )
        if applied is None:
            return
        applied.messages.append(message)
        applied.spent(calls=int(counted), ms=ms)
        seq, before = applied.ledger[call]
        if before in OPEN:
            applied.ledger[call] = (seq, status)

    def _suspend(self, lease: Lease, calls: Sequence[str], ttl_s: float, ms: int) -> None:
        """Suspend on ``calls``, each pending with its own token; one window for all."""
        asked = [
            Asked(call=call, token=hashlib.sha256(self._next("token").encode()).hexdigest())
            for call in calls
        ]
        pending = [
            (
                Pending(
                    tool_call_id=a.call,
                    tool="send",
                    arguments={"call": a.call},
                    preview={},
                    digest="d",
                ),
                a.token,
            )
            for a in asked
        ]
        expires: list[float] = []
        applied = self._fenced(
            lease,
            lambda: expires.append(
                self.store.suspend(lease, calls=pending, ttl_s=ttl_s, elapsed_ms=ms, event={})
            ),
        )
        if applied is None:
            return
        for a in asked:
            self.tokens[a.token] = applied.id
        assert (expires[0] > self.store.now()) is (ttl_s > 0)  # the window, by the DB clock
        applied.state, applied.owner, applied.token = SUSPENDED, None, asked[0].token
        applied.window_open, applied.asked, applied.undecided = ttl_s > 0, asked, len(asked)
        applied.spent(ms=ms)
        self._let_go(lease)

    def _leave(self, lease: Lease, how: str, reason: HaltReason, ms: int) -> None:
        """Leave running under the lease: halt, fail (maybe with an unknown call), or hand
        the run back to the workers (maybe with a delay)."""
        run = self.runs.get(lease.run_id)
        open_calls = run.open_calls() if run is not None else []
        unknown = open_calls[0] if how == "fail_unknown" and open_calls else None
        writes: dict[str, Callable[[], object]] = {
            "halt": lambda: self.store.halt(lease, reason=reason, elapsed_ms=ms, event={}),
            "fail": lambda: self.store.fail(
                lease, reason=FailReason.UNRECONCILABLE, elapsed_ms=ms, event={}
            ),
            "fail_unknown": lambda: self.store.fail(
                lease,
                reason=FailReason.UNRECONCILABLE,
                elapsed_ms=ms,
                event={},
                unknown_call=unknown,
            ),
            "release": lambda: self.store.release(lease, elapsed_ms=ms),
            "release_later": lambda: self.store.release(
                lease, elapsed_ms=ms, event={"why": "backoff"}, delay_s=WINDOW_S, kind="retry"
            ),
        }
        applied = self._fenced(lease, writes[how])
        if applied is None:
            return
        applied.owner = None
        applied.spent(ms=ms)
        if how == "halt":
            applied.state, applied.halt_reason = HALTED, reason.value
        elif how.startswith("fail"):
            applied.state, applied.fail_reason = FAILED, FailReason.UNRECONCILABLE.value
            if unknown is not None:
                applied.ledger[unknown] = (applied.ledger[unknown][0], CallStatus.UNKNOWN)
        else:
            applied.delayed = how == "release_later"
        self._let_go(lease)

    def _heartbeat(self, lease: Lease) -> None:
        current = self._current(lease)
        before = None if current else self._dump()
        assert self.store.heartbeat(lease) is current
        assert self.store.lease_held(lease) is current
        if before is not None:
            assert self._dump() == before
            self._let_go(lease)

    # -- rules --------------------------------------------------------------------------------

    @initialize(max_attempts=st.integers(min_value=1, max_value=2))
    def configure(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts

    @precondition(lambda self: len(self._in(RUNNING, SUSPENDED, HALTED)) < MAX_RUNS)
    @rule(
        user=st.sampled_from(USERS),
        max_steps=st.integers(min_value=1, max_value=9),
        worker=st.none() | st.sampled_from(WORKERS),
    )
    def create(self, user: str, max_steps: int, worker: str | None) -> None:
        """Start a run (and, given a worker, claim it as the worker loop does at once)."""
        run_id = self._next("run")
        first: Message = {"role": "user", "content": f"question of {run_id}"}
        limits = Limits(max_steps=max_steps)
        run = self.store.create_run(
            run_id=run_id,
            user_id=user,
            question=str(first["content"]),
            route={},
            limits=limits,
            scope={"user": user},
            versions={},
            agent_version="t@1",
            messages=[first],
        )
        assert (run.state, run.owner, run.budget) == (RUNNING, None, Budget())
        self.runs[run_id] = Expected(id=run_id, user=user, messages=[first], limits=limits)
        if worker is not None:
            claimed = self.store.claim_ready(worker, run_id)
            assert claimed is not None
            self._granted(claimed, worker)

    def _ready(self) -> list[str]:
        """Runs waiting for a worker: running, no owner, not held back by a delay."""
        return [r.id for r in self._in(RUNNING) if r.owner is None and not r.delayed]

    @precondition(lambda self: bool(self._ready()))
    @rule(worker=st.sampled_from(WORKERS), pick=st.none() | PICK)
    def claim_ready(self, worker: str, pick: int | None) -> None:
        """A worker claims the run waiting longest, or a given run (refused unless it is
        waiting)."""
        ready = self._ready()
        if pick is None:
            listed = {r.id: r for r in self.store.list_runs(limit=1000)}
            carried = Counter(
                r.user_id for r in listed.values() if r.state is RUNNING and r.owner is not None
            )
            # The fair claim (reference §13): the user carrying the fewest runs first, then
            # the run waiting longest.
            order = {i: (carried[listed[i].user_id], listed[i].updated_at) for i in ready}
            first = min(order.values())
            longest = [i for i in ready if order[i] == first]
            # On a tie (one tick of the clock) the store may take either: name one.
            run = self.store.claim_ready(worker, None if len(longest) == 1 else longest[0])
            assert run is not None and run.id == longest[0]
        else:
            run_id = _pick(self._all_ids(), pick)
            before = None if run_id in ready else self._dump()
            run = self.store.claim_ready(worker, run_id)
            if before is not None:
                assert run is None and self._dump() == before
                return
        assert run is not None and run.id in ready
        self._granted(run, worker)

    @precondition(lambda self: bool(self.held))
    @rule(
        pick=PICK,
        calls=st.sampled_from([1, 0, 2]),
        final=st.booleans(),
        spend=st.sampled_from([0.0, 0.125, 0.5]),
        ms=st.integers(min_value=0, max_value=50),
    )
    def write_turn(self, pick: int, calls: int, final: bool, spend: float, ms: int) -> None:
        self._turn(self._owner_lease(pick), calls, final, spend, ms)

    @precondition(lambda self: bool(self.held))
    @rule(
        pick=PICK,
        status=st.sampled_from(list(CallStatus)[1:]),
        counted=st.booleans(),
        ms=st.integers(min_value=0, max_value=50),
        again=st.booleans(),
    )
    def write_tool_result(
        self, pick: int, status: CallStatus, counted: bool, ms: int, again: bool
    ) -> None:
        """The result of the run's first call still waiting for one. ``again`` (or with
        none waiting): a late result that disagrees with a call's final outcome (ok or
        error): its message is appended, its ledger outcome does not change."""
        lease = self._owner_lease(pick)
        if not self._calls(lease, Expected.open_calls):
            self._turn(lease, 1, False, 0.125, ms)  # the turn that asks for the call
        waiting = self._calls(lease, Expected.open_calls)
        done = self._calls(lease, Expected.done_calls)
        if not (waiting or done):
            return  # the lease was stale: the turn was refused
        call = done[0] if (again or not waiting) and done else waiting[0]
        if call in done:
            final = self.runs[lease.run_id].ledger[call][1]
            status = CallStatus.ERROR if final is CallStatus.OK else CallStatus.OK
        self._result(lease, call, status, counted, ms)

    @precondition(lambda self: bool(self.held))
    @rule(
        pick=PICK,
        ttl_s=st.sampled_from([WINDOW_S, 0.0, WINDOW_S]),
        ms=st.integers(0, 50),
        calls=st.integers(min_value=1, max_value=3),
    )
    def suspend(self, pick: int, ttl_s: float, ms: int, calls: int) -> None:
        """The run suspends on ``calls`` calls that have not run yet, each with its own
        token; with fewer, the owner first writes the turn that asks for them (as the loop
        does). A TTL of 0 is already past."""
        lease = self._owner_lease(pick)
        if len(self._calls(lease, Expected.intents)) < calls:
            self._turn(lease, calls, False, 0.125, ms)
        intents = self._calls(lease, Expected.intents)
        if intents and self._current(lease):
            self._suspend(lease, intents[:calls], ttl_s, ms)

    @precondition(lambda self: bool(self.held))
    @rule(
        pick=PICK,
        how=st.sampled_from(LEAVES),
        reason=st.sampled_from(HALTS),
        ms=st.integers(0, 50),
    )
    def leave_running(self, pick: int, how: str, reason: HaltReason, ms: int) -> None:
        self._leave(self._owner_lease(pick), how, reason, ms)

    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK, others=st.lists(PICK, max_size=3))
    def heartbeat(self, pick: int, others: list[int]) -> None:
        """One lease's heartbeat, or many at once (``heartbeat_many``, as the engine's
        heartbeat task does) with leases that may be stale among them."""
        lease = _pick(self.held, pick)
        if not others:
            self._heartbeat(lease)
            return
        leases = [lease, *(_pick(self.issued, i) for i in others)]
        expected = [self._current(each) for each in leases]
        assert self.store.heartbeat_many(leases) == expected
        for each, held in zip(leases, expected, strict=True):
            if not held:
                self._let_go(each)

    @precondition(lambda self: bool(self.held))
    @rule(pick=PICK, long_ago=st.booleans())
    def crash(self, pick: int, long_ago: bool) -> None:
        """The owner dies: it forgets its lease and writes nothing more. ``long_ago``: the
        heartbeat timeout has passed since (its heartbeat is moved back by two windows,
        one of the two writes of this test that do not go through the store)."""
        lease = _pick(self.held, pick)
        self.held.remove(lease)
        if long_ago:
            with self.store.engine.begin() as conn:
                conn.execute(
                    sa.update(runs)
                    .where(runs.c.id == lease.run_id, runs.c.owner == lease.owner)
                    .where(runs.c.lease_epoch == lease.epoch)
                    .values(heartbeat_at=runs.c.heartbeat_at - 2 * WINDOW_S)
                )

    @precondition(lambda self: any(r.window_open for r in self._in(SUSPENDED)))
    @rule(pick=PICK, record=st.booleans(), then=st.sampled_from(["wait", "expire", "continue"]))
    def close_a_window(self, pick: int, record: bool, then: str) -> None:
        """The window of a suspension passes (``record``: after a decision was recorded
        on one of its calls, when others are undecided): its ``expires_at`` is moved back
        by two windows, the other write of this test that does not go through the store.
        From now on, by the database's clock, no decision lands and every token of it
        names only that it expired, the recorded ones too. ``then``: the sweep halts it at
        once, and its owner may continue it at once (its suspension forgotten)."""
        run = _pick([r for r in self._in(SUSPENDED) if r.window_open], pick)
        undecided = [a for a in run.asked if a.decision is None]
        if record and len(undecided) > 1:
            asked = _pick(undecided, pick)
            owner = self._next("approval")
            claim = self._claim(run, asked, owner, "decline", USERS[1])
            assert self._tally(run, [owner], [(asked, "decline", USERS[1])], [claim]) is None
        with self.store.engine.begin() as conn:
            conn.execute(
                sa.update(runs)
                .where(runs.c.id == run.id, runs.c.lease_epoch == run.epoch)
                .values(expires_at=runs.c.expires_at - 2 * WINDOW_S)
            )
        run.window_open = False
        if then != "wait":
            self.expire()
        if then == "continue":
            self._continue(run.id, as_owner=True, why=None)

    @precondition(lambda self: bool(self._stale()))
    @rule(pick=PICK, op=st.sampled_from(STALE_OPS), ms=st.integers(0, 50), same=st.booleans())
    def write_with_a_stale_lease(self, pick: int, op: str, ms: int, same: bool) -> None:
        """A lease that is not the run's current one (superseded, given up, its run
        finished or purged) cannot write anything (invariant 8). ``same``: prefer a lease
        of the very owner that holds the run now, under an older epoch."""
        stale = self._stale()
        if same:
            mine = [lease for lease in stale if self._owner_of(lease.run_id) == lease.owner]
            stale = mine or stale
        lease = _pick(stale, pick)
        if op in ("turn", "answer"):
            self._turn(lease, 1 if op == "turn" else 0, op == "answer", 0.5, ms)
        elif op == "result":
            self._result(lease, "call-0", CallStatus.OK, True, ms)
        elif op == "suspend":
            self._suspend(lease, ["call-0", "call-1"], WINDOW_S, ms)
        elif op == "heartbeat":
            self._heartbeat(lease)
        elif op == "scope":
            self._fenced(lease, lambda: self.store.refresh_scope(lease, {"stale": True}))
        else:
            self._leave(lease, op, HaltReason.MAX_STEPS, ms)

    @precondition(lambda self: bool(self._in(SUSPENDED)))
    @rule(
        pick=PICK,
        votes=st.lists(VOTE, min_size=1, max_size=5),
        every=st.booleans(),
        window_open=st.booleans(),
    )
    def decide_concurrently(
        self, pick: int, votes: list[tuple[int, str, str]], every: bool, window_open: bool
    ) -> None:
        """Approvers race on the tokens of one suspension, several votes a token, all at
        once (invariants 5 and 12; reference §15). Inside the window each token voted on
        gets exactly one decision and its other votes are told it; a decision while
        others are undecided is recorded (the run stays suspended, one fewer undecided,
        no lease changes hands) and the one that takes the last claims the run. After the
        window closed none wins and nothing changes. ``every``: each undecided call gets
        a vote too, so the race ends the suspension. ``window_open``: a suspension whose
        window is open (or closed), when there is one."""
        suspended = self._in(SUSPENDED)
        run = _pick([r for r in suspended if r.window_open is window_open] or suspended, pick)
        chosen = [(_pick(run.asked, i), decision, by) for i, decision, by in votes]
        if every:
            chosen += [(a, "approve", USERS[0]) for a in run.asked if a.decision is None]
        owners = [self._next("approval") for _ in chosen]
        before = self._dump()
        claims = self._race(
            [
                partial(self._claim, run, asked, owner, decision, by)
                for owner, (asked, decision, by) in zip(owners, chosen, strict=True)
            ]
        )
        if not run.window_open:
            assert self._dump() == before
        won = self._tally(run, owners, chosen, claims)
        if won is not None:
            owner, claimed = won
            self._granted(claimed, owner)
            snapshot = self.store.snapshot(run.id)  # what the claimer carries the turn out from
            assert snapshot is not None
            assert {c: (d.decision, d.by) for c, d in snapshot.decisions.items()} == {
                a.call: a.decision for a in run.asked
            }

    def _tally(
        self,
        run: Expected,
        owners: Sequence[str],
        chosen: Sequence[tuple[Asked, str, str]],
        claims: Sequence[object],
    ) -> tuple[str, Run] | None:
        """What concurrent decisions on the calls of ``run``'s suspension did, checked
        and put in the model: at most one recorded decision a token, none after the
        window closed; each recorded one took one off ``undecided`` (so the counts they
        left are the last ones, in some order), and exactly the one that took the last
        claimed the run (its owner and the run it claimed are returned). Every vote that
        lost is told the decision that used its token, if one did."""
        won: dict[str, tuple[str, str, str, Run]] = {}
        for owner, (asked, decision, by), claim in zip(owners, chosen, claims, strict=True):
            assert isinstance(claim, SuspensionClaim)
            if claim.run is not None:
                assert run.window_open and asked.decision is None and asked.token not in won
                won[asked.token] = (owner, decision, by, claim.run)
        left = sorted(claimed.undecided for *_, claimed in won.values())
        assert left == list(range(run.undecided - len(won), run.undecided))
        claimer = None
        for token, (owner, decision, by, claimed) in won.items():
            asked = next(a for a in run.asked if a.token == token)
            asked.decision = (decision, by)
            self._decided(token, run.id, decision, by)
            if claimed.state is RUNNING:
                assert claimer is None and claimed.undecided == 0
                claimer = (owner, claimed)
            else:  # recorded: the run waits on the others, nobody holds it
                assert (claimed.state, claimed.owner) == (SUSPENDED, None)
                assert claimed.lease_epoch == run.epoch
        run.undecided -= len(won)
        assert (claimer is not None) is (run.undecided == 0 and bool(won))
        for (asked, _, _), claim in zip(chosen, claims, strict=True):
            assert isinstance(claim, SuspensionClaim)
            if claim.run is None:
                self._told(claim.decision, asked.token)
        return claimer

    def _decided(self, token: str, run_id: str, decision: str, by: str) -> None:
        """The decision that used ``token`` is recorded: what a later use of it is told."""
        self.used[token] = (run_id, decision, by)
        suspended_on, recorded = self.store.find_by_token(token)
        assert suspended_on is None and recorded is not None
        assert (recorded.run_id, recorded.decision, recorded.by) == (run_id, decision, by)
        snapshot = self.store.snapshot(run_id)  # what the resumed owner goes on from
        assert snapshot is not None and snapshot.decisions.get(recorded.tool_call_id) == recorded

    @precondition(lambda self: bool(self._in(SUSPENDED)))
    @rule(pick=PICK, claimers=st.lists(VOTE, min_size=1, max_size=4))
    def decide_while_expiring_and_cancelling(
        self, pick: int, claimers: list[tuple[int, str, str]]
    ) -> None:
        """Decisions on the calls of one suspension race the expiry sweep and the
        owner's cancel: at most one decision a token, at most one claim (by the last),
        none recorded nor claiming after the window closed by the database's clock, and
        the run ends cancelled."""
        run = _pick(self._in(SUSPENDED), pick)
        others_due = {r.id for r in self._in(SUSPENDED) if not r.window_open and r is not run}
        chosen = [(_pick(run.asked, i), decision, by) for i, decision, by in claimers]
        owners = [self._next("approval") for _ in chosen]
        calls: list[Callable[[], object]] = [
            partial(self._claim, run, asked, owner, decision, by)
            for owner, (asked, decision, by) in zip(owners, chosen, strict=True)
        ]
        calls.append(lambda: self.store.expire_suspended(batch=100))
        calls.append(lambda: self.store.cancel(run_id=run.id, user_id=run.user, by=run.user))
        *claims, expired, cancelled = self._race(calls)
        assert isinstance(expired, list) and len(set(expired)) == len(expired)
        assert set(expired) - {run.id} == others_due
        assert isinstance(cancelled, Run) and cancelled.state is CANCELLED
        for run_id in others_due:
            self.runs[run_id].state = HALTED
            self.runs[run_id].halt_reason = EXPIRED
        if run.id in expired:
            assert not run.window_open
            run.halt_reason = EXPIRED
        # Which decisions landed before the cancel is up to the threads; _tally checks
        # them against the model and records them (a closed window: none).
        won = self._tally(run, owners, chosen, claims)
        if won is not None:
            # Whether the claim won is up to the threads, so its lease is not kept for
            # later steps (the model's shape must not depend on timing): it is fenced out
            # here and now, the run being cancelled.
            owner, claimed = won
            assert claimed.lease_epoch == run.epoch + 1 and claimed.owner == owner
            run.epoch = claimed.lease_epoch
            run.state, run.owner = CANCELLED, None
            lease = claimed.lease()
            late: Message = {"role": "assistant", "content": "too late"}
            self._fenced(
                lease,
                lambda: self.store.persist_turn(
                    lease,
                    seq=self._seq(lease),
                    message=late,
                    spend_usd=0.5,
                    elapsed_ms=7,
                    intents=[],
                    final=False,
                    event={},
                ),
            )
        run.state, run.owner = CANCELLED, None

    @precondition(lambda self: any(r.window_open for r in self._in(SUSPENDED)))
    @rule(pick=PICK, deliver=st.sampled_from(["none", "one", "all"]))
    def reissue_lost_notices(self, pick: int, deliver: str) -> None:
        """Each undecided call of a suspension whose notice was never delivered gets one
        fresh token while the window is open (the old one reached nobody and claims
        nothing from now on); a call whose notice was delivered (``deliver``: one or all
        of a suspension's, now), or that is decided, keeps its token."""
        if deliver != "none":
            run = _pick(self._in(SUSPENDED), pick)
            for asked in run.asked if deliver == "all" else [_pick(run.asked, pick)]:
                self.store.mark_notified(run.id, asked.token)
                asked.notified = True
        due = [
            (r.id, a.call)
            for r in self._in(SUSPENDED)
            if r.window_open
            for a in r.asked
            if a.decision is None and not a.notified
        ]
        since = [r.suspended_at for r in self.store.list_runs(limit=1000) if r.suspended_at]
        self._clock_past(max(since))
        fresh: list[str] = []

        def new_hash() -> str:
            fresh.append(hashlib.sha256(self._next("token").encode()).hexdigest())
            return fresh[-1]

        reissued = self.store.reissue_unnotified(older_than_s=0.0, batch=100, new_hashes=new_hash)
        assert sorted((run.id, c.pending.tool_call_id) for run, c in reissued) == sorted(due)
        assert [call.token_hash for _, call in reissued] == fresh
        for got, call in reissued:
            exp = self.runs[got.id]
            asked = next(a for a in exp.asked if a.call == call.pending.tool_call_id)
            assert call.decided is None and not call.notified
            asked.token = call.token_hash
            self.tokens[asked.token] = got.id
            exp.token = exp.asked[0].token
        for got, _ in reissued:  # the run as it was left, every call re-issued
            exp = self.runs[got.id]
            assert (got.state, got.pending_token_hash) == (SUSPENDED, exp.token)
            assert [c.token_hash for c in got.pending_calls] == [a.token for a in exp.asked]

    @precondition(lambda self: bool(self.tokens))
    @rule(pick=PICK, owner=st.sampled_from(WORKERS), of_expired=st.booleans())
    def claim_a_spent_token(self, pick: int, owner: str, of_expired: bool) -> None:
        """A token that was used (its decision recorded, claiming or not), expired,
        superseded, re-issued, purged, or never issued claims nothing and changes
        nothing, and a decision with it is told the decision that used it. Once its
        suspension's window closed, every token of it names only that it expired, the
        recorded ones too (reference §15). ``of_expired``: a token of such a suspension,
        when there is one."""
        live = {
            a.token
            for r in self._in(SUSPENDED)
            if r.window_open
            for a in r.asked
            if a.decision is None
        }
        spent = [t for t in self.tokens if t not in live] + ["0" * 64]
        expired = [t for r in self.runs.values() if self._expired_suspension(r) for t in r.tokens()]
        token = _pick(expired if of_expired and expired else spent, pick)
        run_id = self.tokens.get(token, "never-made")
        before = self._dump()
        claim = self.store.claim_decision(
            run_id=run_id, token_hash=token, owner=owner, decision="approve", approver="dana"
        )
        assert claim.run is None and self._dump() == before
        self._told(claim.decision, token)  # what the approver who lost is told
        found = self.store.match_token(token)
        assert found.run is None and found.call is None
        exp = self.runs.get(run_id)
        if exp is not None and self._expired_suspension(exp) and token in exp.tokens():
            assert found.decision is None
            assert found.expired is not None and found.expired.id == run_id
        else:
            assert found.expired is None
            self._told(found.decision, token)

    def _expired_suspension(self, run: Expected) -> bool:
        """Whether the run's calls are those of a suspension whose window closed."""
        if run.state is SUSPENDED:
            return not run.window_open
        return run.state is HALTED and run.halt_reason == EXPIRED

    @precondition(lambda self: any(r.owner is not None for r in self._in(RUNNING)))
    @rule(reaper=st.sampled_from(REAPERS), stale_after_s=st.sampled_from([0.0, WINDOW_S]))
    def reap(self, reaper: str, stale_after_s: float) -> None:
        """Claim orphans: runs whose owner's heartbeat is older than ``stale_after_s`` by
        the database's clock, judged at some moment between ``t0`` and ``t1`` (a run stale
        at ``t0`` must be taken, one still fresh at ``t1`` must not). With 0, once that
        clock has passed every heartbeat, every owned run is an orphan: live owners lose
        their lease too (legal: they are fenced out). With a window, only owners that
        crashed long ago lose theirs. A run recovered ``max_attempts`` times already fails
        ``recovery_exhausted`` instead (invariant 9)."""
        beats: dict[str, float] = {}
        for r in self.store.list_runs(limit=1000):
            if r.state is RUNNING and r.owner is not None:
                assert r.heartbeat_at is not None
                beats[r.id] = r.heartbeat_at
        self._clock_past(max(beats.values()))
        t0 = self.store.now()
        claimed, exhausted = self.store.claim_orphans(
            owner=reaper, stale_after_s=stale_after_s, max_attempts=self.max_attempts, batch=100
        )
        t1 = self.store.now()
        taken = {r.id for r in claimed} | set(exhausted)
        assert len(taken) == len(claimed) + len(exhausted)  # never one run twice
        assert taken <= set(beats)
        for run_id, beat in beats.items():
            if beat < t0 - stale_after_s:
                assert run_id in taken
            if beat >= t1 - stale_after_s:
                assert run_id not in taken
        for run in claimed:  # invariant 9: recovered at most max_attempts times
            exp = self.runs[run.id]
            assert exp.recovery_attempts < self.max_attempts
            exp.recovery_attempts += 1
            assert run.recovery_attempts == exp.recovery_attempts
            self._granted(run, reaper)
        for run_id in exhausted:
            exp = self.runs[run_id]
            assert exp.recovery_attempts >= self.max_attempts
            exp.state, exp.owner = FAILED, None
            exp.fail_reason = FailReason.RECOVERY_EXHAUSTED.value

    @precondition(lambda self: bool(self._in(SUSPENDED)))
    @rule()
    def expire(self) -> None:
        """Exactly the suspensions whose window closed are halted, ``suspension_expired``."""
        due = [r for r in self._in(SUSPENDED) if not r.window_open]
        expired = self.store.expire_suspended(batch=100)
        assert sorted(expired) == sorted(r.id for r in due)
        for run in due:
            run.state, run.halt_reason = HALTED, HaltReason.SUSPENSION_EXPIRED.value

    @precondition(lambda self: bool(self.runs))
    @rule(
        action=st.sampled_from(["continue", "cancel"]),
        pick=PICK,
        halted=st.booleans(),
        as_owner=st.booleans(),
        why=st.sampled_from([None, "needs more steps"]),
    )
    def owner_request(
        self, action: str, pick: int, halted: bool, as_owner: bool, why: str | None
    ) -> None:
        """A user continues or cancels a run: a halted one (``halted``, when there is one)
        or any (refused unless it is the user's own run, halted to continue, unfinished to
        cancel)."""
        candidates = [r.id for r in self._in(HALTED)] if halted else []
        run_id = _pick(candidates or self._all_ids(), pick)
        if action == "continue":
            self._continue(run_id, as_owner=as_owner, why=why)
        else:
            self._cancel(run_id, as_owner=as_owner)

    @precondition(lambda self: bool(self._in(HALTED) or self.held))
    @rule(pick=PICK, why=st.sampled_from([None, "needs more steps"]), other_first=st.booleans())
    def continue_halted(self, pick: int, why: str | None, other_first: bool) -> None:
        """The owner continues a halted run with the default grant (``other_first``:
        after another user tried, refused). With none halted, a run whose owner holds it
        first halts on its budget, as the loop does."""
        if not self._in(HALTED):
            self._leave(self._owner_lease(pick), "halt", HaltReason.MAX_STEPS, 5)
        if self._in(HALTED):
            run_id = _pick(self._in(HALTED), pick).id
            if other_first:
                self._continue(run_id, as_owner=False, why=why)
            self._continue(run_id, as_owner=True, why=why)

    def _continue(self, run_id: str, *, as_owner: bool, why: str | None) -> None:
        """Only the owner continues a halted run, with a recorded grant (invariant 10)."""
        run = self.runs.get(run_id)
        user = _owner_or_other(run, as_owner)
        limits = (run.limits if run is not None else Limits()).extended()
        applies = run is not None and run.state is HALTED and user == run.user
        before = None if applies else self._dump()
        got = self.store.continue_halted(
            run_id=run_id, user_id=user, limits=limits, by=user, why=why
        )
        if run is None or not applies:
            assert got is None and self._dump() == before
            return
        assert got is not None and (got.state, got.owner, got.limits) == (RUNNING, None, limits)
        grant = self.store.events(run_id)[-1]
        assert grant.kind == "continued"
        assert grant.data == {
            "by": user,
            "why": why,
            "previous_halt_reason": run.halt_reason,
            "old_limits": run.limits.to_json(),
            "new_limits": limits.to_json(),
            "budget": run.budget.to_json(),
        }
        run.state, run.halt_reason, run.limits, run.delayed = RUNNING, None, limits, False
        # Its suspension is forgotten: its decisions no longer apply, and its tokens name
        # no expired suspension any more (reference §15).
        snapshot = self.store.snapshot(run_id)
        assert snapshot is not None and snapshot.decisions == {}
        for token in run.tokens():
            found = self.store.match_token(token)
            assert found.run is None and found.expired is None
            self._told(found.decision, token)
        run.asked = []

    def _cancel(self, run_id: str, *, as_owner: bool) -> None:
        """The owner cancels any run that is not finished; nobody else can."""
        run = self.runs.get(run_id)
        user = _owner_or_other(run, as_owner)
        applies = run is not None and run.state not in TERMINAL and user == run.user
        before = None if applies else self._dump()
        got = self.store.cancel(run_id=run_id, user_id=user, by=user)
        if run is None or not applies:
            assert got is None and self._dump() == before
            return
        assert got is not None and (got.state, got.owner) == (CANCELLED, None)
        run.state, run.owner = CANCELLED, None

    @precondition(lambda self: bool(self._in(HALTED, *TERMINAL)))
    @rule(retention_s=st.sampled_from([WINDOW_S, 0.0]))
    def purge(self, retention_s: float) -> None:
        """Retention: a halted or finished run last changed more than ``retention_s``
        before ``t0`` is purged, one that changed later than ``t1`` - ``retention_s`` is
        kept (with 0, once the database's clock has passed every change, all are purged),
        and a purged run is gone entirely: row, messages, trace, ledger, decisions."""
        changed = {
            r.id: r.updated_at
            for r in self.store.list_runs(limit=1000)
            if r.state is HALTED or r.state in TERMINAL
        }
        self._clock_past(max(changed.values()))
        t0 = self.store.now()
        count = self.store.purge_retained(retention_s=retention_s, batch=100)
        t1 = self.store.now()
        gone = [run_id for run_id in self.runs if self.store.get_run(run_id) is None]
        assert count == len(gone) and set(gone) <= set(changed)
        for run_id, at in changed.items():
            if at < t0 - retention_s:
                assert run_id in gone
            if at >= t1 - retention_s:
                assert run_id not in gone
        for run_id in gone:
            del self.runs[run_id]
            self.seen.pop(run_id, None)
            self.purged.append(run_id)
            assert self.store.messages(run_id) == [] and self.store.events(run_id) == []
            assert self.store.ledger(run_id) == [] and self.store.snapshot(run_id) is None

    # -- the invariants -----------------------------------------------------------------------

    @invariant()
    def the_store_agrees_with_the_model_and_the_invariants_hold(self) -> None:
        if self._store is None:
            return  # no step has touched the database yet
        messages: dict[str, list[Message]] = defaultdict(list)
        ledger: dict[str, dict[str, tuple[int, CallStatus]]] = defaultdict(dict)
        with self.store.engine.connect() as conn:
            rows = [Run.from_row(r._mapping) for r in conn.execute(sa.select(runs))]
            seqs = sa.select(run_messages).order_by(run_messages.c.run_id, run_messages.c.seq)
            for run_id, seq, message in conn.execute(seqs):
                assert seq == len(messages[run_id])  # in order, no gap
                messages[run_id].append(message)
            for entry in conn.execute(sa.select(tool_calls)):
                assert entry.idempotency_key == f"{entry.run_id}:{entry.tool_call_id}"
                ledger[entry.run_id][entry.tool_call_id] = (entry.seq, CallStatus(entry.status))
            used = {
                d.token_hash: (d.run_id, d.decision, d.decided_by)
                for d in conn.execute(sa.select(decisions))
            }
            traced = set(conn.execute(sa.select(run_events.c.run_id).distinct()).scalars())
        # No run lost, none made up, and nothing left of a purged run in any table.
        assert {run.id for run in rows} == set(self.runs)
        assert set(messages) | set(ledger) | traced <= set(self.runs)
        # One decision per token, kept for as long as its run is (invariant 5).
        assert used == {t: d for t, d in self.used.items() if d[0] in self.runs}
        for run in rows:
            self._check(run, messages[run.id], ledger[run.id])
        # Each user's carried and waiting runs, and the first of those, as the claims read
        # them (``user_load``, kept by triggers), are the runs' own.
        assert stored_load(self.store) == true_load(self.store)
        assert stored_heads(self.store) == true_heads(self.store)

    def _check(
        self, run: Run, messages: list[Message], ledger: dict[str, tuple[int, CallStatus]]
    ) -> None:
        exp = self.runs[run.id]
        statuses = {call: status for call, (_, status) in ledger.items()}
        prev = self.seen.get(run.id)
        if prev is not None:
            # Legal transitions only; terminal is final (reference §1).
            assert run.state is prev.state or can_transition(prev.state, run.state), (
                f"{run.id}: {prev.state.value} → {run.state.value}"
            )
            assert prev.state not in TERMINAL or run.state is prev.state
            # The messages are append-only (invariant 1).
            assert messages[: len(prev.messages)] == prev.messages
            # Consumed budget only grows (invariant 4).
            for name in ("steps", "spend_usd", "tool_calls", "elapsed_ms"):
                assert getattr(run.budget, name) >= getattr(prev.budget, name), name
            assert run.lease_epoch >= prev.epoch
            assert run.recovery_attempts >= prev.recovery_attempts
            # A ledger entry stays, and its outcome, once ok or error, is final.
            for call, status in prev.ledger.items():
                assert statuses.get(call) is status or status in OPEN
        # The model, exactly.
        assert (run.state, run.owner, run.lease_epoch) == (exp.state, exp.owner, exp.epoch)
        assert (run.halt_reason, run.fail_reason) == (exp.halt_reason, exp.fail_reason)
        assert (run.budget, run.limits) == (exp.budget, exp.limits)
        assert run.recovery_attempts == exp.recovery_attempts
        assert messages == exp.messages and run.message_count == len(messages)
        assert ledger == exp.ledger
        assert run.pending_token_hash == exp.token
        # Only a running run has an owner: nobody may write any other (invariant 8).
        assert run.owner is None or run.state is RUNNING
        if run.state is SUSPENDED:
            assert run.pending is not None and run.pending.tool_call_id == exp.asked[0].call
            assert run.expires_at is not None
            # Its calls in call order, each decided or not, and how many wait (reference §15).
            assert run.undecided == exp.undecided == sum(a.decision is None for a in exp.asked)
            got = self.store.get_run(run.id)
            assert got is not None
            assert [
                (c.pending.tool_call_id, c.token_hash, c.position, _decision(c.decided))
                for c in got.pending_calls
            ] == [(a.call, a.token, n, a.decision) for n, a in enumerate(exp.asked)]
        assert (run.halt_reason is not None) is (run.state is HALTED) or run.state is CANCELLED
        assert (run.fail_reason is not None) is (run.state is FAILED)
        # Bounded recovery (invariant 9).
        assert run.recovery_attempts <= self.max_attempts
        if run.fail_reason == FailReason.RECOVERY_EXHAUSTED.value:
            assert run.recovery_attempts == self.max_attempts
        self.seen[run.id] = Seen(
            state=run.state,
            messages=list(messages),
            budget=run.budget,
            epoch=run.lease_epoch,
            recovery_attempts=run.recovery_attempts,
            ledger=statuses,
        )


def _decision(decided: dict[str, Any] | None) -> tuple[str, str] | None:
    """A pending call's ``decided`` as the model keeps it."""
    return None if decided is None else (decided["decision"], decided["by"])


def _owner_or_other(run: Expected | None, as_owner: bool) -> str:
    if run is None:
        return USERS[0]
    return run.user if as_owner else next(u for u in USERS if u != run.user)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_interleavings_keep_the_invariants_of_runs(
    backend: str, templates: dict[str, str], tmp_path: Path
) -> None:
    # SQLite files go to memory when the machine has a tmpfs: durability is not what this
    # tests, and a synchronous commit to disk is most of an example's time.
    with tempfile.TemporaryDirectory(dir=MEMORY if MEMORY.is_dir() else tmp_path) as folder:
        machine = partial(RunMachine, backend, templates, Path(folder))
        sized = settings(SETTINGS, max_examples=EXAMPLES[backend])
        run_state_machine_as_test(machine, settings=sized)  # type: ignore[no-untyped-call]
