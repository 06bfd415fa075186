"""The ``Engine``: what an application calls to start runs, carry them to their next stop,
decide them, act on them and read them back (reference §17, "The Python API"). One way
for each task; the HTTP/inbox side is ``Engine.web``, the operator's is
``Engine.operator``, and a worker's plumbing is ``Engine.runner``.

Async throughout; the constructor does no I/O. The schema is checked (or, with
``migrate=True``, built in an empty database) on first use by every method that reads or
writes the store (``opening.opens``), or by ``async with Engine(...)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

from tether import inputs
from tether._runtime.control import forks, owner
from tether._runtime.fleet import schedules, versions
from tether._runtime.fleet.runner import Runner
from tether._runtime.hop import hop
from tether.agent import Agent
from tether.approvals import batch, inbox, preview, resume
from tether.approvals.request import asked
from tether.budget import Limits
from tether.config import Settings
from tether.engine import reading
from tether.engine.opening import opens
from tether.engine.operator import Operator
from tether.engine.parts import Parts
from tether.engine.web import WebSide
from tether.errors import ConfigError, InvalidInput, NotFound
from tether.models.base import Model
from tether.notify import Notifier
from tether.results import (
    ApprovalPreview,
    ApprovalResult,
    CallDecision,
    Delta,
    Inbox,
    LiveEvent,
    Outcome,
    RunPage,
    RunView,
    StopKind,
    ThreadView,
    TreeView,
)
from tether.runs import Run
from tether.store import LedgerEntry
from tether.store.audit import AuditPage, audit_cursor
from tether.store.schedules import ScheduleRecord

if TYPE_CHECKING:
    from tether.engine.sync import SyncEngine


class Engine:
    """Runs an agent durably on a store; one engine carries many runs concurrently.

    ``migrate=True`` builds the schema in an empty database; otherwise an empty, older or
    newer schema is refused with a message that says to run ``tether migrate``.
    ``public_url`` is the base of the approval links in notices (``/approve/{token}``);
    by default ``TETHER_PUBLIC_URL`` (``settings.public_url``), else links are relative.
    ``listen_database_url`` is where ``LISTEN`` connects (needed when ``database_url`` is
    a transaction pooler's, docs/operations.md "Behind PgBouncer"); by default
    ``TETHER_LISTEN_DATABASE_URL`` when the database is the settings' own, else the
    database URL. Callers are named ``user`` (whose runs) and ``approver`` (who decides).
    """

    def __init__(
        self,
        *,
        agent: Agent,
        model: Model,
        settings: Settings | None = None,
        database_url: str | None = None,
        listen_database_url: str | None = None,
        notifier: Notifier | None = None,
        worker_id: str | None = None,
        migrate: bool = False,
        public_url: str | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self._parts = Parts(
            agent=agent,
            model=model,
            settings=self.settings,
            database_url=database_url,
            listen_database_url=listen_database_url,
            notifier=notifier,
            public_url=public_url,
        )
        self.public_url = self._parts.public_url  # where links in notices start ("": relative)
        self._services = self._parts.services
        self._migrate_empty = migrate
        self._opened = False
        self._runner = Runner(self._services, worker_id, self.open)
        self.web = WebSide(self)
        """What the HTTP API and the inbox call besides: sign-ins, keys, decisions by run."""
        self.operator = Operator(self)
        """What an operator calls: users, schema, the reaper, stranded runs, counts."""

    @classmethod
    def from_env(cls, *, agent: Agent, **options: Any) -> Engine:
        """An engine configured as the CLI's is: ``Settings.from_env()`` and the model
        ``TETHER_MODEL`` names, else the agent's default model. ``options`` are the
        constructor's (``notifier``, ``migrate``, ...)."""
        settings = Settings.from_env()
        model = agent.model_from(settings)
        if model is None:
            raise ConfigError("set TETHER_MODEL (this agent has no default model)")
        return cls(agent=agent, model=model, settings=settings, **options)

    @property
    def agent(self) -> Agent:
        return self._services.agent

    @property
    def runner(self) -> Runner:
        """What a ``Worker`` drives: claims, carrying a run, recovery and upkeep."""
        return self._runner

    @property
    def sync(self) -> SyncEngine:
        """The same API, blocking, for scripts without an event loop."""
        from tether.engine.sync import SyncEngine

        return SyncEngine(self)

    # -- life cycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Check the schema (build it in an empty database with ``migrate=True``). Safe to
        call twice: it checks once per engine."""
        if not self._opened:
            await hop(self._services.store.ensure_schema, migrate_empty=self._migrate_empty)
            self._opened = True

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def close(self) -> None:
        """Stop the heartbeat and the notice senders, and release the database
        connections."""
        self._parts.close()

    async def aclose(self) -> None:
        """Give queued notices a moment to go out (those that do not are re-issued by a
        reaper later), then release the model's client and the database connections."""
        await self._parts.aclose()

    # -- runs --------------------------------------------------------------------------------

    async def start_run(
        self,
        user: str,
        question: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        route: dict[str, Any] | None = None,
        thread_id: str | None = None,
        if_busy: str = "reject",
        idempotency_key: str | None = None,
        priority: int | None = None,
        start_at: datetime | str | None = None,
    ) -> Run:
        """Create a run for ``user`` asking ``question``; it waits for a worker (or for
        ``run_until_stop``). Its scope is resolved now and stored as a snapshot.

        Without ``thread_id`` it starts a new thread; with one of ``user``'s threads it is
        a follow-up, and the model sees the thread's conversation, then ``question``
        (reference §14). A follow-up to a busy thread is ``thread_busy`` (naming the run it
        would wait on), or with ``if_busy="enqueue"`` it is ``queued`` and starts once the
        runs before it have stopped. ``not_found`` for a thread that is not ``user``'s.

        With ``idempotency_key`` (1-255 printable ASCII characters) a repeat by ``user``
        with the same arguments, concurrent or not, returns the first call's run (as it
        is now) and creates nothing; other arguments are ``idempotency_mismatch``.

        ``priority`` (-10 to 10, default 0) orders the claims, highest first; ``start_at``
        (an aware ``datetime`` or ISO-8601 with a UTC offset) keeps the run ``queued``
        until then by the database's clock (reference §13)."""
        given: dict[str, Any] = {"limits": limits, "route": route, "thread_id": thread_id}
        given.update(if_busy=if_busy, idempotency_key=idempotency_key)
        given.update(priority=priority, start_at=start_at)
        return (await self.web.accept_run(user, question, **given)).run

    async def run_until_stop(self, run_id: str) -> Outcome:
        """Claim ``run_id`` (it must be waiting for a worker) and carry it to its next stop:
        answered, suspended, halted or failed; ``wrong_version`` if this engine does not
        serve the run's agent version (reference §12)."""
        run = await self._runner.claim(inputs.run_id(run_id))
        if run is None:
            existing = await hop(self._services.store.get_run, run_id)
            if existing is None:
                raise NotFound("no such run")
            versions.check_served(self._services, existing)
            return Outcome(run_id=run_id, kind=StopKind.of(existing.state))
        return await self._runner.carry(run)

    async def ask(
        self,
        user: str,
        question: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        thread_id: str | None = None,
    ) -> Outcome:
        """``start_run`` then ``run_until_stop`` in this process, as a script or a test
        asks (a service starts runs and lets its workers carry them). ``Outcome.answer``
        holds the final answer when it answered (``Outcome.output`` its validated
        ``output_type``). A busy thread is ``thread_busy``."""
        run = await self.start_run(user, question, limits=limits, thread_id=thread_id)
        return await self.run_until_stop(run.id)

    @opens
    async def continue_run(
        self,
        run_id: str,
        user: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        why: str | None = None,
    ) -> Run:
        """Continue a halted run with a deliberate, logged grant; it waits for a worker."""
        return await owner.continue_run(self._services, run_id, user, limits=limits, why=why)

    @opens
    async def cancel_run(self, run_id: str, user: str) -> Run:
        """Cancel a run that is not terminal."""
        return await owner.cancel_run(self._services, run_id, user)

    @opens
    async def fork_run(self, run_id: str, user: str, *, at_step: int, dry_run: bool = False) -> Run:
        """A new halted run of ``user``'s run through step ``at_step`` (reference §12)."""
        return await forks.fork_run(self._services, run_id, user, at_step=at_step, dry_run=dry_run)

    # -- decisions ---------------------------------------------------------------------------

    @opens
    async def resume_after_confirmation(
        self,
        token: str,
        decision: str,
        approver: str,
        *,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        digest: str | None = None,
    ) -> ApprovalResult:
        """Carry out a human decision on a suspended run (reference §4, §9): with a reason,
        and for an approval the approver's edited ``arguments`` and the ``digest`` of the
        preview of that edit they saw."""
        ask = asked(decision, approver, reason=reason, arguments=arguments, digest=digest)
        return await resume.by_token(self._services, self._runner.worker_id, token, ask)

    @opens
    async def decide_calls(
        self, run_id: str, approver: str, decisions: Sequence[Mapping[str, Any]]
    ) -> list[CallDecision]:
        """Decide pending calls of one run by their tool call ids (reference §6, §15): each
        entry ``{"tool_call_id", "decision", "reason"?, "arguments"?, "digest"?}`` as a
        token's decision. All are checked before any is recorded (``invalid_input``);
        ``not_found`` when ``approver`` may neither own nor approve the run. Each call's
        answer is its own: the decision carried out, or its refusal (reference §4)."""
        worker = self._runner.worker_id
        return await batch.decide_calls(self._services, worker, run_id, approver, decisions)

    @opens
    async def preview_approval(
        self, token: str, approver: str, arguments: dict[str, Any] | None = None
    ) -> ApprovalPreview:
        """The pending call's preview with ``arguments`` (default: as pending), and its
        digest; never claims, never changes anything (reference §9)."""
        return await preview.by_token(self._services, token, approver, arguments)

    @opens
    async def pending_approvals(
        self, approver: str, *, after: str | None = None, limit: int = 100
    ) -> Inbox:
        """A page of the suspended runs inside their window that ``approver`` owns or may
        decide, soonest expiry first, after the run ``after`` (``Inbox.after`` of the page
        before); ``more`` says how many follow (iterate it like a list)."""
        viewer = inputs.user_id(approver, "approver")
        return await inbox.pending_approvals(self._services, viewer, after=after, limit=limit)

    @opens
    async def audit(self, viewer: str, *, after: int = 0, limit: int = 100) -> AuditPage:
        """A page of the audit of decisions (reference §19): the records of ``viewer``'s
        runs and those whose ``by`` is ``viewer``, in ``seq`` order, after ``after``."""
        viewer = inputs.user_id(viewer, "user")
        after, limit = audit_cursor(after, limit)
        records, more = await hop(self._services.store.audit_page, viewer, after, limit)
        return AuditPage(records=records, more=more)

    # -- reading -----------------------------------------------------------------------------

    @opens
    async def get_run(self, run_id: str, *, user: str | None = None) -> RunView:
        """A run with its messages; ``not_found`` if missing or not ``user``'s."""
        return await reading.run_view(self._services, run_id, user)

    @opens
    async def get_tree(self, run_id: str, *, user: str | None = None) -> TreeView:
        """The tree of sub-agents ``run_id`` belongs to (any run of it may be named),
        parents before children, with each run's ``consumed_tree`` (reference §18);
        ``not_found`` if missing or not ``user``'s."""
        return await reading.tree_view(self._services, run_id, user)

    @opens
    async def list_runs(
        self,
        user: str | None = None,
        *,
        state: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> RunPage:
        """A page of runs, newest first (only ``user``'s if given, in ``state`` if given),
        after the run ``after`` (``RunPage.after`` of the page before), and how many more
        follow (iterate it like a list). ``invalid_input`` for an unknown state or a
        cursor that names none of the runs listed."""
        return await reading.runs_page(self._services, user, state=state, after=after, limit=limit)

    @opens
    async def events(self, run_id: str) -> list[LiveEvent]:
        """The run's trace, oldest first, each event as ``watch`` gives it (with its SEQ)."""
        return await reading.events(self._services, run_id)

    @opens
    async def ledger(self, run_id: str) -> list[LedgerEntry]:
        """The run's tool-call ledger, in call order, each entry with the result the model
        saw."""
        return await reading.ledger(self._services, run_id)

    @overload
    def watch(
        self, run_id: str, *, after: int = ..., user: str | None = ..., deltas: Literal[False] = ...
    ) -> AsyncIterator[LiveEvent]: ...
    @overload
    def watch(
        self, run_id: str, *, after: int = ..., user: str | None = ..., deltas: bool
    ) -> AsyncIterator[LiveEvent | Delta]: ...

    async def watch(
        self, run_id: str, *, after: int = 0, user: str | None = None, deltas: bool = False
    ) -> AsyncIterator[LiveEvent | Delta]:
        """The run's events after SEQ ``after`` as they are stored, until a terminal state
        (reference §11); ``not_found`` if missing or not ``user``'s, ``invalid_input`` for an
        ``after`` that is not a SEQ. With ``deltas``, also the text of the step being
        generated, as ``Delta`` items (reference §16)."""
        start = inputs.after_seq(after)
        if not isinstance(deltas, bool):
            raise InvalidInput("deltas must be true or false")
        view = await self.get_run(run_id, user=user)
        hub = self._services.deltas if deltas else None
        async for event in self._parts.events.watch(view.run.id, start, hub):
            yield event

    @opens
    async def forks_of(self, run_id: str) -> list[Run]:
        """The runs forked from ``run_id``, oldest first."""
        return await forks.forks_of(self._services, run_id)

    async def now(self) -> float:
        """The database's clock, in epoch seconds (invariant 11)."""
        return await hop(self._services.store.now)

    # -- threads -----------------------------------------------------------------------------

    @opens
    async def get_thread(self, thread_id: str, *, user: str | None = None) -> ThreadView:
        """A thread with its runs and whole conversation; ``not_found`` if it is missing or
        not ``user``'s (any user's without ``user``: the operator's view)."""
        return await reading.thread_view(self._services, thread_id, user)

    @opens
    async def list_threads(self, user: str | None = None, limit: int = 100) -> list[ThreadView]:
        """Threads, most recently active first (only ``user``'s if given), without their
        messages."""
        return await reading.threads(self._services, user, limit)

    @opens
    async def delete_thread(self, thread_id: str, *, user: str) -> None:
        """Delete ``user``'s thread and everything of its runs, in one transaction;
        ``thread_busy`` (nothing deleted) while a run of it is running, suspended or
        queued, ``not_found`` if it is not theirs."""
        await hop(
            self._services.store.delete_thread, inputs.thread_id(thread_id, missing=True), user
        )

    # -- schedules ---------------------------------------------------------------------------

    @opens
    async def add_schedule(
        self,
        user: str,
        cron_expression: str,
        question: str,
        *,
        limits: Limits | Mapping[str, Any] | None = None,
        timezone_name: str = "UTC",
    ) -> ScheduleRecord:
        """A schedule of ``user``: each tick of ``cron_expression`` (in ``timezone_name``)
        starts a run of ``user`` asking ``question`` with ``limits`` (reference §13).
        ``invalid_input`` for a bad expression, timezone, question or limits (nothing is
        stored)."""
        return await schedules.add_schedule(
            self._services,
            user,
            cron_expression,
            question,
            limits=limits,
            timezone_name=timezone_name,
        )

    @opens
    async def list_schedules(self, user: str | None = None) -> list[ScheduleRecord]:
        """``user``'s schedules (everyone's without ``user``: the operator's view)."""
        return await schedules.list_schedules(self._services, user)

    @opens
    async def get_schedule(self, schedule_id: str, *, user: str | None = None) -> ScheduleRecord:
        """A schedule; ``not_found`` when it is missing or not ``user``'s."""
        return await schedules.get_schedule(self._services, schedule_id, user=user)

    @opens
    async def delete_schedule(self, schedule_id: str, *, user: str) -> None:
        """Delete ``user``'s schedule (its runs stay); ``not_found`` if it is not theirs."""
        await schedules.delete_schedule(self._services, schedule_id, user=user)
