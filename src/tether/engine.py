"""The public Python API: an ``Engine`` starts runs, carries them to their next stop,
resumes them, and reads them back. The HTTP layer and the CLI use nothing else.

Async throughout; the constructor does no I/O. The schema is checked (or, with
``migrate=True``, built in an empty database) by ``open()``, which every method calls
on first use, or by ``async with Engine(...)``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tether import inputs
from tether._runtime import control, forks, versions
from tether._runtime.control import OrphanClaim
from tether._runtime.feed import Feed, after_seq
from tether._runtime.heartbeat import Heartbeat
from tether._runtime.services import Services, hop
from tether.agent import Agent
from tether.approvals import preview, resume
from tether.approvals.inbox import ServiceAPI
from tether.budget import Limits, parse_limits
from tether.config import Settings
from tether.errors import InvalidInput, NotFound
from tether.models.base import Message, Model
from tether.notify import LogNotifier, Notifier, Outbox
from tether.results import (
    ApprovalPreview,
    ApprovalResult,
    LiveEvent,
    Outcome,
    ReapReport,
    RunView,
    StopKind,
)
from tether.runs import Run
from tether.store import Event, LedgerEntry, Store
from tether.telemetry import tracing

if TYPE_CHECKING:
    from tether.sync import SyncEngine

MAX_QUESTION_CHARS = 100_000
# How long closing an engine waits for queued notices to go out.
NOTICE_DRAIN_S = 5.0


def new_worker_id() -> str:
    """A unique owner name for this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Engine(ServiceAPI):
    """Runs an agent durably on a store; one engine carries many runs concurrently.

    ``migrate=True`` builds the schema in an empty database; otherwise an empty, older or
    newer schema is refused with a message that says to run ``tether migrate``.
    ``public_url`` is the base of the approval links in notices (``/approve/{token}``).
    """

    def __init__(
        self,
        *,
        agent: Agent,
        model: Model,
        settings: Settings | None = None,
        database_url: str | None = None,
        notifier: Notifier | None = None,
        worker_id: str | None = None,
        migrate: bool = False,
        public_url: str = "",
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.store = Store(
            database_url or self.settings.database_url,
            heartbeat_refresh_s=self.settings.heartbeat_timeout_s / 3,
            retry_s=self.settings.db_retry_s,
        )
        self.worker_id = worker_id or new_worker_id()
        self._migrate_empty = migrate
        self._opened = False
        self._feed = Feed(self.store, poll_s=self.settings.watch_poll_s)
        base = public_url.rstrip("/")
        notifier = notifier or LogNotifier()
        self.services = Services(
            store=self.store,
            agent=agent,
            model=model,
            settings=self.settings,
            notifier=notifier,
            heartbeat=Heartbeat(self.store, self.settings.heartbeat_timeout_s / 3),
            outbox=Outbox(notifier, self.store, timeout_s=self.settings.notice_timeout_s),
            approve_url=lambda token: f"{base}/approve/{token}",
        )

    @property
    def agent(self) -> Agent:
        return self.services.agent

    # -- life cycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Check the schema (build it in an empty database with ``migrate=True``). Safe to
        call twice: it checks once per engine."""
        if not self._opened:
            await hop(self.store.ensure_schema, migrate_empty=self._migrate_empty)
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
        self.services.heartbeat.stop()
        self.services.outbox.stop()
        self._feed.stop()
        self.store.close()

    async def aclose(self) -> None:
        """Give queued notices a moment to go out (those that do not are re-issued by a
        reaper later), then release the model's client and the database connections."""
        await self.services.outbox.drain(NOTICE_DRAIN_S)
        await self.services.model.aclose()
        self.close()

    # -- starting and driving runs ---------------------------------------------------------

    async def start_run(
        self,
        user_id: str,
        question: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        route: dict[str, Any] | None = None,
    ) -> Run:
        """Create a run for ``user_id`` asking ``question``; it waits for a worker (or for
        ``run_until_stop``). Its scope is resolved now and stored as a snapshot."""
        inputs.user_id(user_id)
        inputs.text(question, "question", MAX_QUESTION_CHARS)
        run_limits = parse_limits(limits, self.settings.default_limits)
        await self.open()
        scope = await self.agent.resolve_scope(user_id)
        messages: list[Message] = [
            {"role": "system", "content": self.agent.instructions},
            {"role": "user", "content": question},
        ]
        run_id = uuid.uuid4().hex
        with tracing.run_created(run_id, user_id, self.agent.name) as span:
            return await hop(
                self.store.create_run,
                run_id=run_id,
                user_id=user_id,
                question=question,
                route=route or {"agent": self.agent.name},
                limits=run_limits,
                scope=scope.to_json(),
                versions=self.agent.versions(),
                agent_version=self.agent.agent_version,
                messages=messages,
                trace_context=span.carrier(),  # the run's later spans continue this trace
            )

    async def run_until_stop(self, run_id: str) -> Outcome:
        """Claim ``run_id`` (it must be waiting for a worker) and carry it to its next stop:
        answered, suspended, halted or failed; ``wrong_version`` if this engine does not
        serve the run's agent version (SPEC §12)."""
        await self.open()
        served = self.services.versions
        run = await hop(
            self.store.claim_ready, self.worker_id, inputs.run_id(run_id), versions=served
        )
        if run is None:
            existing = await hop(self.store.get_run, run_id)
            if existing is None:
                raise NotFound("no such run")
            versions.check_served(self.services, existing)
            return Outcome(run_id=run_id, kind=StopKind.of(existing.state))
        return await self.carry(run)

    async def run_next(self) -> Outcome | None:
        """Claim the run that has waited longest for a worker and carry it to its next
        stop; None if no run waits."""
        run = await self.claim_next()
        return None if run is None else await self.carry(run)

    async def ask(
        self, user_id: str, question: str, *, limits: Limits | dict[str, Any] | None = None
    ) -> Outcome:
        """Start a run and carry it to its first stop; ``Outcome.answer`` holds the final
        answer when it answered (and ``Outcome.output`` its validated ``output_type``)."""
        run = await self.start_run(user_id, question, limits=limits)
        return await self.run_until_stop(run.id)

    async def claim_next(self) -> Run | None:
        """Take the lease of the run that has waited longest for a worker, if any."""
        await self.open()
        return await hop(
            self.store.claim_ready, self.worker_id, None, versions=self.services.versions
        )

    async def carry(self, run: Run, *, stopping: asyncio.Event | None = None) -> Outcome:
        """Carry a run this engine claimed to its next stop (see ``control.carry``)."""
        return await control.carry(self.services, run, stopping=stopping)

    # -- resumptions -----------------------------------------------------------------------

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
        """Carry out a human decision on a suspended run (SPEC §4, §9): with a reason, and
        for an approval the approver's edited ``arguments`` and the ``digest`` of the
        preview they saw."""
        await self.open()
        return await resume.resume_after_confirmation(
            self.services,
            self.worker_id,
            token,
            decision,
            approver,
            reason=reason,
            arguments=arguments,
            digest=digest,
        )

    async def resume_by_run(
        self,
        run_id: str,
        decision: str,
        approver: str,
        *,
        tool_call_id: str,
        digest: str | None,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        approved_digest: str | None = None,
    ) -> ApprovalResult:
        """Decide the pending call ``tool_call_id`` of ``run_id`` (shown with ``digest``)
        from an inbox, without the token; same claim, checks and errors as a token.
        ``approved_digest``: the digest of the re-rendered preview of an edit."""
        await self.open()
        return await resume.resume_by_run(
            self.services,
            self.worker_id,
            run_id,
            decision,
            approver,
            tool_call_id=tool_call_id,
            digest=digest,
            reason=reason,
            arguments=arguments,
            approved_digest=approved_digest,
        )

    async def preview_approval(
        self, token: str, approver: str, arguments: dict[str, Any] | None = None
    ) -> ApprovalPreview:
        """The pending call's preview with ``arguments`` (default: as pending), and its
        digest; never claims, never changes anything (SPEC §9)."""
        await self.open()
        return await preview.preview_approval(self.services, token, approver, arguments)

    async def preview_by_run(
        self,
        run_id: str,
        approver: str,
        *,
        tool_call_id: str,
        arguments: dict[str, Any] | None = None,
    ) -> ApprovalPreview:
        """``preview_approval`` for the inbox, by run and pending call."""
        await self.open()
        return await preview.preview_by_run(
            self.services, run_id, approver, tool_call_id=tool_call_id, arguments=arguments
        )

    async def continue_run(
        self,
        run_id: str,
        user: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        why: str | None = None,
    ) -> Run:
        """Continue a halted run with a deliberate, logged grant; it waits for a worker."""
        await self.open()
        return await control.continue_run(self.services, run_id, user, limits=limits, why=why)

    async def cancel_run(self, run_id: str, user: str) -> Run:
        """Cancel a run that is not terminal."""
        await self.open()
        return await control.cancel_run(self.services, run_id, user)

    async def fork_run(self, run_id: str, user: str, *, at_step: int, dry_run: bool = False) -> Run:
        """A new halted run of ``user``'s run through step ``at_step`` (SPEC §12)."""
        await self.open()
        return await forks.fork_run(self.services, run_id, user, at_step=at_step, dry_run=dry_run)

    async def forks_of(self, run_id: str) -> list[Run]:
        """The runs forked from ``run_id``, oldest first."""
        await self.open()
        return await forks.forks_of(self.services, run_id)

    async def claim_orphans(self, limit: int, *, before: float | None = None) -> OrphanClaim:
        """Take over up to ``limit`` runs whose owner's heartbeat is stale (and older than
        ``before``, on the database's clock, if given)."""
        await self.open()
        return await control.claim_orphans(self.services, self.worker_id, limit, before=before)

    async def orphan_census(self) -> tuple[float, bool]:
        """The database's clock now and whether any run's owner has a stale heartbeat."""
        await self.open()
        return await control.orphan_census(self.services)

    async def recover(self, run: Run) -> Outcome:
        """Reconcile one claimed orphan and hand it back to the workers."""
        return await control.recover(self.services, run)

    async def recover_orphans(self) -> list[Outcome]:
        """One reaper pass over runs whose owner's heartbeat is stale."""
        await self.open()
        return await control.recover_orphans(self.services, self.worker_id)

    async def expire_suspended(self) -> list[str]:
        """Halt suspended runs whose approval window has passed."""
        await self.open()
        return await control.expire_suspended(self.services)

    async def reissue_notices(self) -> list[str]:
        """Re-send suspension notices that were never delivered, with fresh tokens."""
        await self.open()
        return await control.reissue_notices(self.services)

    async def purge_retained(self) -> int:
        """Delete runs kept past the retention."""
        await self.open()
        return await control.purge_retained(self.services)

    async def stranded_runs(self, limit: int = 100) -> list[Run]:
        """Runs waiting on an agent version no live worker serves (SPEC §12)."""
        await self.open()
        return await versions.stranded(self.services, limit)

    async def count_stranded(self) -> int:
        """How many runs are stranded (the ``tether_runs_stranded`` gauge)."""
        await self.open()
        return await versions.count_stranded(self.services)

    async def migrate_run(
        self, run_id: str, to_version: str, *, by: str, why: str | None = None
    ) -> Run:
        """Move a waiting run to ``to_version`` deliberately (see ``versions.migrate_run``)."""
        await self.open()
        return await versions.migrate_run(self.services, run_id, to_version, by=by, why=why)

    async def reap(self) -> ReapReport:
        """One reaper pass: recover orphans, expire suspensions, re-send undelivered
        notices, purge past retention."""
        recovered = await self.recover_orphans()
        return ReapReport(
            recovered=[o.run_id for o in recovered if o.kind is StopKind.RELEASED],
            stopped={o.run_id: o.kind.value for o in recovered if o.kind is not StopKind.RELEASED},
            expired=await self.expire_suspended(),
            notices_reissued=await self.reissue_notices(),
            purged=await self.purge_retained(),
        )

    # -- reading ---------------------------------------------------------------------------

    async def get_run(self, run_id: str, *, user_id: str | None = None) -> RunView:
        """A run with its messages; ``not_found`` if missing or not ``user_id``'s."""
        await self.open()
        snapshot = await hop(self.store.snapshot, inputs.run_id(run_id))
        if snapshot is None or (user_id is not None and snapshot.run.user_id != user_id):
            raise NotFound("no such run")
        return RunView(run=snapshot.run, messages=snapshot.messages)

    async def find_run(self, run_id: str) -> Run | None:
        """The run, without its messages; None if there is none."""
        await self.open()
        return await hop(self.store.get_run, inputs.run_id(run_id))

    async def run_owner(self, run_id: str) -> str:
        """The user a run belongs to; ``not_found`` if there is no such run."""
        run = await self.find_run(run_id)
        if run is None:
            raise NotFound("no such run")
        return run.user_id

    async def list_runs(self, user_id: str | None = None, limit: int = 100) -> list[Run]:
        """Runs, newest first (only ``user_id``'s if given)."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        await self.open()
        return list(await hop(self.store.list_runs, user_id, limit))

    async def events(self, run_id: str) -> list[Event]:
        """The run's trace, oldest first."""
        await self.open()
        return list(await hop(self.store.events, inputs.run_id(run_id)))

    async def watch(
        self, run_id: str, *, after: int = 0, user_id: str | None = None
    ) -> AsyncIterator[LiveEvent]:
        """The run's events after SEQ ``after`` as they are stored, until a terminal state
        (SPEC §11); ``not_found`` if missing or not ``user_id``'s, ``invalid_input`` for
        an ``after`` that is not a SEQ. See ``tether._runtime.feed``."""
        start = after_seq(after)
        run = await self.find_run(run_id)
        if run is None or (user_id is not None and run.user_id != user_id):
            raise NotFound("no such run")
        async for event in self._feed.watch(run.id, start):
            yield event

    async def ledger(self, run_id: str) -> list[LedgerEntry]:
        """The run's tool-call ledger, in call order."""
        await self.open()
        return list(await hop(self.store.ledger, inputs.run_id(run_id)))

    @property
    def sync(self) -> SyncEngine:
        """The same API for scripts without an event loop."""
        from tether.sync import SyncEngine

        return SyncEngine(self)
