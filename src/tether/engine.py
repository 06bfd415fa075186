"""The public Python API: an ``Engine`` starts runs, carries them to their next stop,
resumes them, and reads them back; the HTTP layer and the CLI use nothing else. A worker's
plumbing (claims of orphans, upkeep) is the ``Runner`` the ``Worker`` owns.

Async throughout; the constructor does no I/O. The schema is checked (or, with
``migrate=True``, built in an empty database) by ``open()``, which every method calls
on first use, or by ``async with Engine(...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

from tether import inputs
from tether._runtime import control, deltas, forks, versions
from tether._runtime.accounts import AccountMethods
from tether._runtime.feed import Feed
from tether._runtime.heartbeat import Heartbeat
from tether._runtime.hop import hop, hop_once
from tether._runtime.opening import opens
from tether._runtime.rate_limit import RateLimiter
from tether._runtime.runner import Runner, new_worker_id
from tether._runtime.schedules import ScheduleMethods
from tether._runtime.services import Services
from tether._runtime.starting import CreationMethods
from tether.agent import Agent
from tether.approvals.methods import DecisionMethods
from tether.budget import Limits
from tether.config import Settings
from tether.errors import ConfigError, InvalidInput, NotFound, NotReady
from tether.inputs import after_seq
from tether.messages import tool_results
from tether.models.base import Model
from tether.notify import LogNotifier, Notifier, Outbox
from tether.results import (
    Delta,
    LiveEvent,
    Outcome,
    ReapReport,
    RunPage,
    RunView,
    StopKind,
    ThreadView,
)
from tether.runs import Run, RunState, answer_of
from tether.store import CallStatus, LedgerEntry, Store, upgrade

if TYPE_CHECKING:
    from tether.sync import SyncEngine

# How long closing an engine waits for queued notices to go out.
NOTICE_DRAIN_S = 5.0


class Engine(DecisionMethods, AccountMethods, CreationMethods, ScheduleMethods):
    """Runs an agent durably on a store; one engine carries many runs concurrently.

    ``migrate=True`` builds the schema in an empty database; otherwise an empty, older or
    newer schema is refused with a message that says to run ``tether migrate``.
    ``public_url`` is the base of the approval links in notices (``/approve/{token}``);
    by default ``TETHER_PUBLIC_URL`` (``settings.public_url``), else links are relative.
    ``listen_database_url`` is where ``LISTEN`` connects (needed when ``database_url`` is
    a transaction pooler's, docs/operations.md "Behind PgBouncer"); by default
    ``TETHER_LISTEN_DATABASE_URL`` when the database is the settings' own, else the
    database URL.
    Callers are named ``user`` (whose runs) and ``approver`` (who decides).
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
        if listen_database_url is None and database_url is None:
            listen_database_url = self.settings.listen_database_url  # of the same database
        self._store = Store(
            database_url or self.settings.database_url,
            listen_url=listen_database_url,
            heartbeat_refresh_s=self.settings.heartbeat_timeout_s / 3,
            retry_s=self.settings.db_retry_s,
        )
        self._migrate_empty = migrate
        self._opened = False
        self._feed = Feed(self._store, poll_s=self.settings.watch_poll_s)
        base = ((self.settings.public_url if public_url is None else public_url) or "").rstrip("/")
        self.public_url = base  # where links in notices start ("": relative links)
        notifier = notifier or LogNotifier(links=self.settings.log_approval_links)
        self._services = Services(
            store=self._store,
            agent=agent,
            model=model,
            settings=self.settings,
            notifier=notifier,
            heartbeat=Heartbeat(self._store, self.settings.heartbeat_timeout_s / 3),
            outbox=Outbox(notifier, self._store, timeout_s=self.settings.notice_timeout_s),
            approve_url=lambda token: f"{base}/approve/{token}",
            deltas=deltas.hub_for(self._store),
            limiter=RateLimiter.of(self._store, self.settings),
        )
        self._hub_released = False
        self._runner = Runner(self._services, worker_id or new_worker_id(), self.open)

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
    def worker_id(self) -> str:
        """The owner name this engine's claims carry."""
        return self._runner.worker_id

    # -- life cycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Check the schema (build it in an empty database with ``migrate=True``). Safe to
        call twice: it checks once per engine."""
        if not self._opened:
            await hop(self._store.ensure_schema, migrate_empty=self._migrate_empty)
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
        try:
            self._services.heartbeat.stop()
            self._services.limiter.close()
            self._services.outbox.stop()
            self._feed.stop()
            if not self._hub_released and self._services.deltas is not None:
                self._hub_released = True
                deltas.release(self._services.deltas)
        finally:
            self._store.close()

    async def aclose(self) -> None:
        """Give queued notices a moment to go out (those that do not are re-issued by a
        reaper later), then release the model's client and the database connections."""
        await self._services.outbox.drain(NOTICE_DRAIN_S)
        await self._services.model.aclose()
        self.close()

    async def migrate(self) -> None:
        """Upgrade the schema to this code's version, then make sure the agent's fixed
        users exist. Safe twice: both are no-ops the second time."""
        await hop(self._store.check_commits)
        await hop(upgrade, self._store.engine)
        self._opened = True
        await self.ensure_agent_users()

    async def ready(self) -> None:
        """Raise ``not_ready`` unless the database answers and its schema is current."""
        try:
            await hop_once(self._store.ping)
        except Exception as exc:
            raise NotReady(f"database unreachable: {type(exc).__name__}") from exc
        await self.open()

    # -- starting and driving runs ---------------------------------------------------------

    async def run_until_stop(self, run_id: str) -> Outcome:
        """Claim ``run_id`` (it must be waiting for a worker) and carry it to its next stop:
        answered, suspended, halted or failed; ``wrong_version`` if this engine does not
        serve the run's agent version (reference §12)."""
        run = await self._runner.claim(inputs.run_id(run_id))
        if run is None:
            existing = await hop(self._store.get_run, run_id)
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
        """Start a run (a follow-up in ``thread_id`` if given) and carry it to its first
        stop; ``Outcome.answer`` holds the final answer when it answered (and
        ``Outcome.output`` its validated ``output_type``). A busy thread is ``thread_busy``."""
        run = await self.start_run(user, question, limits=limits, thread_id=thread_id)
        return await self.run_until_stop(run.id)

    async def reap(self) -> ReapReport:
        """One reaper pass: recover orphans, expire suspensions, re-send undelivered
        notices, purge past retention (what a worker's reaper does on its interval)."""
        return await self._runner.reap()

    # -- acting on a run ---------------------------------------------------------------------

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
        return await control.continue_run(self._services, run_id, user, limits=limits, why=why)

    @opens
    async def cancel_run(self, run_id: str, user: str) -> Run:
        """Cancel a run that is not terminal."""
        return await control.cancel_run(self._services, run_id, user)

    @opens
    async def fork_run(self, run_id: str, user: str, *, at_step: int, dry_run: bool = False) -> Run:
        """A new halted run of ``user``'s run through step ``at_step`` (reference §12)."""
        return await forks.fork_run(self._services, run_id, user, at_step=at_step, dry_run=dry_run)

    @opens
    async def forks_of(self, run_id: str) -> list[Run]:
        """The runs forked from ``run_id``, oldest first."""
        return await forks.forks_of(self._services, run_id)

    @opens
    async def move_run(
        self, run_id: str, to_version: str, *, user: str, why: str | None = None
    ) -> Run:
        """Move a waiting run to agent version ``to_version`` deliberately, by ``user``
        (see ``versions.move_run``)."""
        return await versions.move_run(self._services, run_id, to_version, by=user, why=why)

    @opens
    async def stranded_runs(self, limit: int = 100) -> list[Run]:
        """Runs waiting on an agent version no live worker serves (reference §12)."""
        return await versions.stranded(self._services, limit)

    @opens
    async def count_stranded(self) -> int:
        """How many runs are stranded (the ``tether_runs_stranded`` gauge)."""
        return await versions.count_stranded(self._services)

    # -- reading ---------------------------------------------------------------------------

    @opens
    async def get_run(self, run_id: str, *, user: str | None = None) -> RunView:
        """A run with its messages; ``not_found`` if missing or not ``user``'s."""
        snapshot = await hop(self._store.snapshot, inputs.run_id(run_id))
        if snapshot is None or (user is not None and snapshot.run.user_id != user):
            raise NotFound("no such run")
        # Its own messages: a fork of a follow-up also holds a copy of what came before.
        own = snapshot.messages[snapshot.run.base_count :]
        run = snapshot.run
        if run.state is RunState.ANSWERED and own:  # its final answer is its last message
            run = dataclasses.replace(run, answer=answer_of(own[-1]))
        return RunView(run=run, messages=own)

    @opens
    async def list_runs(self, user: str | None = None, limit: int = 100) -> list[Run]:
        """Runs, newest first (only ``user``'s if given)."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        return list(await hop(self._store.list_runs, user, limit))

    @opens
    async def events(self, run_id: str) -> list[LiveEvent]:
        """The run's trace, oldest first, each event as ``watch`` gives it (with its SEQ)."""
        found = await hop(self._store.events, inputs.run_id(run_id))
        return [LiveEvent.of(event, seq) for seq, event in enumerate(found, start=1)]

    @opens
    async def ledger(self, run_id: str) -> list[LedgerEntry]:
        """The run's tool-call ledger, in call order, each entry with the result the model
        saw: the store keeps a result once, in its message, and it is read from there."""
        return await hop(self._ledger, inputs.run_id(run_id))

    def _ledger(self, run_id: str) -> list[LedgerEntry]:
        entries = self._store.ledger(run_id)
        answered = [
            e.seq for e in entries if e.result is None and e.status is not CallStatus.INTENT
        ]
        if not answered:
            return entries
        seen = tool_results(self._store.messages(run_id, from_seq=min(answered)))
        return [
            dataclasses.replace(e, result=seen[e.tool_call_id])
            if e.result is None and e.tool_call_id in seen
            else e
            for e in entries
        ]

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
        generated, as ``Delta`` items (reference §16). See ``tether._runtime.feed`` and
        ``tether._runtime.deltas``."""
        start = after_seq(after)
        if not isinstance(deltas, bool):
            raise InvalidInput("deltas must be true or false")
        view = await self.get_run(run_id, user=user)
        hub = self._services.deltas if deltas else None
        async for event in self._feed.watch(view.run.id, start, hub):
            yield event

    @opens
    async def get_thread(self, thread_id: str, *, user: str | None = None) -> ThreadView:
        """A thread with its runs and whole conversation; ``not_found`` if it is missing or
        not ``user``'s (any user's without ``user``: the operator's view)."""
        found = await hop(self._store.thread, inputs.thread_id(thread_id, missing=True), user)
        if found is None:
            raise NotFound("no such thread")
        return ThreadView.of(found)

    @opens
    async def list_threads(self, user: str | None = None, limit: int = 100) -> list[ThreadView]:
        """Threads, most recently active first (only ``user``'s if given), without their
        messages."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        return [ThreadView.of(t) for t in await hop(self._store.threads, user, limit)]

    @opens
    async def delete_thread(self, thread_id: str, *, user: str) -> None:
        """Delete ``user``'s thread and everything of its runs, in one transaction;
        ``thread_busy`` (nothing deleted) while a run of it is running, suspended or
        queued, ``not_found`` if it is not theirs."""
        await hop(self._store.delete_thread, inputs.thread_id(thread_id, missing=True), user)

    async def now(self) -> float:
        """The database's clock, in epoch seconds (invariant 11)."""
        return await hop(self._store.now)

    @opens
    async def counts_by_state(self) -> dict[str, int]:
        """How many runs are in each state, fleet-wide (every state present)."""
        return await hop(self._store.count_by_state)

    @opens
    async def counts_waiting(self) -> dict[str, int]:
        """How many runs wait by why (reference §13): fleet-wide, their thread, their start
        time, their user's cap (this engine's ``max_active_per_user``); in this process,
        the model's rate limit (``rate_limit``)."""
        cap = self._services.settings.max_active_per_user
        counts = await hop(self._store.count_waiting, cap)
        return {**counts, "rate_limit": self._services.limiter.waiting}

    @opens
    async def runs_page(
        self, user: str, *, state: str | None = None, after: str | None = None, limit: int = 50
    ) -> RunPage:
        """One page of ``user``'s runs, newest first (in ``state`` if given), after the run
        ``after`` (``RunPage.after`` of the page before), and how many more follow it.
        ``invalid_input`` for an unknown state or a cursor that names none of their runs."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        found = await hop(
            self._store.runs_page,
            user,
            state=inputs.run_state(state) if state is not None else None,
            after=inputs.run_id(after) if after is not None else None,
            limit=limit,
        )
        if found is None:
            raise InvalidInput("after must name one of the user's runs (a page's last run)")
        return RunPage(runs=found[0], more=found[1])

    @property
    def sync(self) -> SyncEngine:
        """The same API for scripts without an event loop."""
        from tether.sync import SyncEngine

        return SyncEngine(self)
