"""The public Python API: an ``Engine`` starts runs, carries them to their next stop,
resumes them, and reads them back. Async, with a thin sync facade for scripts."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from tether import inputs
from tether.agent import Agent
from tether.budget import Limits, parse_limits
from tether.config import Settings
from tether.errors import InvalidInput, NotFound
from tether.loop import Outcome, Services, StopKind, hash_token
from tether.models.base import Message, Model
from tether.notify import LogNotifier, Notifier
from tether.resume import (
    ApprovalResult,
    cancel_run,
    continue_run,
    expire_suspended,
    hop,
    purge_retained,
    recover_orphans,
    reissue_notices,
    resume_after_confirmation,
    resume_by_run,
    start_driver,
)
from tether.runs import Run
from tether.store import Event, LedgerEntry, Store, ensure_schema

T = TypeVar("T")

MAX_QUESTION_CHARS = 100_000


@dataclass(frozen=True, kw_only=True)
class RunView:
    """A run with its messages, as a caller reads it."""

    run: Run
    messages: list[Message]


def new_worker_id() -> str:
    """A unique owner name for this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Engine:
    """Runs an agent durably on a store. One engine can carry many runs concurrently.

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
        )
        try:
            ensure_schema(self.store.engine, migrate_empty=migrate)
        except Exception:
            self.store.close()
            raise
        self.worker_id = worker_id or new_worker_id()
        self.services = Services(
            store=self.store,
            agent=agent,
            model=model,
            settings=self.settings,
            notifier=notifier or LogNotifier(),
            approve_url=lambda token: f"{public_url.rstrip('/')}/approve/{token}",
        )

    @property
    def agent(self) -> Agent:
        return self.services.agent

    def close(self) -> None:
        """Release the database connections."""
        self.store.close()

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
        scope = await self.agent.resolve_scope(user_id)
        messages: list[Message] = [
            {"role": "system", "content": self.agent.system_prompt},
            {"role": "user", "content": question},
        ]
        return await hop(
            self.store.create_run,
            run_id=uuid.uuid4().hex,
            user_id=user_id,
            question=question,
            route=route or {"agent": self.agent.name},
            limits=run_limits,
            scope=scope.to_json(),
            versions=self.agent.versions(),
            messages=messages,
        )

    async def run_until_stop(self, run_id: str) -> Outcome:
        """Claim ``run_id`` (it must be waiting for a worker) and carry it to its next stop:
        answered, suspended, halted or failed."""
        run = await hop(self.store.claim_ready, self.worker_id, inputs.run_id(run_id))
        if run is None:
            existing = await hop(self.store.get_run, run_id)
            if existing is None:
                raise NotFound("no such run")
            return Outcome(run_id=run_id, kind=_kind_of(existing))
        driver = await start_driver(self.services, run)
        return await driver.drive()

    async def run_next(self) -> Outcome | None:
        """Claim the run that has waited longest for a worker and carry it to its next
        stop; None if no run waits."""
        run = await hop(self.store.claim_ready, self.worker_id, None)
        if run is None:
            return None
        driver = await start_driver(self.services, run)
        return await driver.drive()

    async def ask(
        self, user_id: str, question: str, *, limits: Limits | dict[str, Any] | None = None
    ) -> Outcome:
        """Start a run and carry it to its first stop."""
        run = await self.start_run(user_id, question, limits=limits)
        return await self.run_until_stop(run.id)

    # -- resumptions ---------------------------------------------------------------------

    async def resume_after_confirmation(
        self, token: str, decision: str, approver: str
    ) -> ApprovalResult:
        """Carry out a human decision on a suspended run (SPEC §4)."""
        return await resume_after_confirmation(
            self.services, self.worker_id, token, decision, approver
        )

    async def resume_by_run(
        self,
        run_id: str,
        decision: str,
        approver: str,
        *,
        tool_call_id: str,
        digest: str | None,
    ) -> ApprovalResult:
        """Decide the pending call ``tool_call_id`` of ``run_id`` (shown with ``digest``)
        from an inbox, without the token; same claim, checks and errors as a token."""
        return await resume_by_run(
            self.services,
            self.worker_id,
            run_id,
            decision,
            approver,
            tool_call_id=tool_call_id,
            digest=digest,
        )

    async def recover_orphans(self) -> list[Outcome]:
        """One reaper pass over runs whose owner's heartbeat is stale."""
        return await recover_orphans(self.services, self.worker_id)

    async def continue_run(
        self,
        run_id: str,
        user: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        why: str | None = None,
    ) -> Run:
        """Continue a halted run with a deliberate, logged grant; it waits for a worker."""
        return await continue_run(self.services, run_id, user, limits=limits, why=why)

    async def cancel_run(self, run_id: str, user: str) -> Run:
        """Cancel a run that is not terminal."""
        return await cancel_run(self.services, run_id, user)

    async def expire_suspended(self) -> list[str]:
        """Halt suspended runs whose approval window has passed."""
        return await expire_suspended(self.services)

    async def purge_retained(self) -> int:
        """Delete runs kept past the retention."""
        return await purge_retained(self.services)

    async def reap(self) -> dict[str, Any]:
        """One reaper pass: recover orphans, expire suspensions, re-send undelivered
        notices, purge past retention."""
        recovered = await self.recover_orphans()
        expired = await self.expire_suspended()
        reissued = await reissue_notices(self.services)
        purged = await self.purge_retained()
        return {
            "recovered": [o.run_id for o in recovered if o.kind is StopKind.RELEASED],
            "stopped": {
                o.run_id: o.kind.value for o in recovered if o.kind is not StopKind.RELEASED
            },
            "expired": expired,
            "notices_reissued": reissued,
            "purged": purged,
        }

    async def owner_of_token(self, token: str) -> str | None:
        """The user whose run a token belongs to (pending or used), for the operator CLI."""
        run, used = await hop(self.store.find_by_token, hash_token(inputs.token(token)))
        if run is not None:
            return run.user_id
        if used is not None:
            owner = await hop(self.store.get_run, used.run_id)
            return owner.user_id if owner else None
        return None

    # -- reading -------------------------------------------------------------------------

    async def get_run(self, run_id: str, *, user_id: str | None = None) -> RunView:
        """A run with its messages; ``not_found`` if missing or not ``user_id``'s."""
        snapshot = await hop(self.store.snapshot, inputs.run_id(run_id))
        if snapshot is None or (user_id is not None and snapshot.run.user_id != user_id):
            raise NotFound("no such run")
        return RunView(run=snapshot.run, messages=snapshot.messages)

    async def list_runs(self, user_id: str | None = None, limit: int = 100) -> list[Run]:
        """Runs, newest first (only ``user_id``'s if given)."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        return list(await hop(self.store.list_runs, user_id, limit))

    async def events(self, run_id: str) -> list[Event]:
        """The run's trace, oldest first."""
        return list(await hop(self.store.events, inputs.run_id(run_id)))

    async def ledger(self, run_id: str) -> list[LedgerEntry]:
        """The run's tool-call ledger, in call order."""
        return list(await hop(self.store.ledger, inputs.run_id(run_id)))

    # -- sync facade ---------------------------------------------------------------------

    @property
    def sync(self) -> SyncEngine:
        """The same API for scripts without an event loop."""
        return SyncEngine(self)


def _kind_of(run: Run) -> StopKind:
    return {
        "answered": StopKind.ANSWERED,
        "suspended": StopKind.SUSPENDED,
        "halted": StopKind.HALTED,
        "failed": StopKind.FAILED,
        "cancelled": StopKind.FAILED,
    }.get(run.state.value, StopKind.RELEASED)


class SyncEngine:
    """Blocking wrappers over ``Engine`` for scripts; each call runs its own event loop."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @staticmethod
    def _run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    def start_run(self, user_id: str, question: str, **kwargs: Any) -> Run:
        return self._run(self._engine.start_run(user_id, question, **kwargs))

    def run_until_stop(self, run_id: str) -> Outcome:
        return self._run(self._engine.run_until_stop(run_id))

    def ask(self, user_id: str, question: str, **kwargs: Any) -> Outcome:
        return self._run(self._engine.ask(user_id, question, **kwargs))

    def resume_after_confirmation(self, token: str, decision: str, approver: str) -> ApprovalResult:
        return self._run(self._engine.resume_after_confirmation(token, decision, approver))

    def continue_run(self, run_id: str, user: str, **kwargs: Any) -> Run:
        return self._run(self._engine.continue_run(run_id, user, **kwargs))

    def cancel_run(self, run_id: str, user: str) -> Run:
        return self._run(self._engine.cancel_run(run_id, user))

    def reap(self) -> dict[str, Any]:
        return self._run(self._engine.reap())

    def get_run(self, run_id: str, *, user_id: str | None = None) -> RunView:
        return self._run(self._engine.get_run(run_id, user_id=user_id))

    def list_runs(self, user_id: str | None = None, limit: int = 100) -> list[Run]:
        return self._run(self._engine.list_runs(user_id, limit))
