"""A test bench of run sessions on a real store, for the unit tests of ``tether._runtime``
(the call path, the session, the loop): the parts an engine hands its sessions
(``Services``) built around one store, an agent of the test's own tools and a
``ScriptedModel``; a run created and claimed as a worker claims it; and what the store then
holds, read back to check what was written. ``with Bench(url, *tools, turns=...) as
bench:`` closes it after the test."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from tether import Agent, MemoryNotifier, Scope, ScriptedModel
from tether._runtime.hop import hop
from tether._runtime.shared.heartbeat import Heartbeat
from tether._runtime.shared.services import Services
from tether._runtime.step.session import RunSession
from tether.budget import parse_limits
from tether.config import Settings
from tether.messages import ToolCall
from tether.models.base import Message, Model
from tether.notify import Outbox
from tether.runs import Run
from tether.scope import ScopeResolver
from tether.store import Event, LedgerEntry, Store
from tether.tools.tool import Tool

OWNER = "unit-worker"
RIVAL = "rival-worker"


async def _scope(user_id: str) -> Scope:
    return Scope(user_id=user_id, approvers=frozenset({"boss"}))


class Bench:
    """One store, one agent (``tools``, ``resolve``) and one model (``turns`` scripted, or
    ``model``), as an engine wires them for its sessions."""

    def __init__(
        self,
        url: str,
        *tools: Tool,
        turns: Sequence[dict[str, Any]] = (),
        model: Model | None = None,
        resolve: ScopeResolver = _scope,
        **settings: Any,
    ) -> None:
        self.settings = Settings(database_url=url, **settings)
        self.store = Store(
            url,
            heartbeat_refresh_s=self.settings.heartbeat_timeout_s / 3,
            retry_s=self.settings.db_retry_s,
        )
        self.agent = Agent(
            name="unit", system_prompt="You are a unit test.", tools=tools, resolve_scope=resolve
        )
        self.model = model or ScriptedModel(list(turns))
        self.notifier = MemoryNotifier()
        self.services = Services(
            store=self.store,
            agent=self.agent,
            model=self.model,
            settings=self.settings,
            notifier=self.notifier,
            heartbeat=Heartbeat(self.store, self.settings.heartbeat_timeout_s / 3),
            outbox=Outbox(self.notifier, self.store, timeout_s=self.settings.notice_timeout_s),
        )

    def close(self) -> None:
        self.services.heartbeat.stop()
        self.services.outbox.stop()
        self.store.close()

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs --------------------------------------------------------------------------------

    async def new_run(
        self, question: str = "go", *, user: str = "dana", limits: dict[str, Any] | None = None
    ) -> Run:
        """A run waiting for a worker, as ``Engine.start_run`` creates it."""
        scope = await self.agent.resolve_scope(user)
        messages: list[Message] = [
            {"role": "system", "content": self.agent.instructions},
            {"role": "user", "content": question},
        ]
        return await hop(
            self.store.create_run,
            run_id=uuid.uuid4().hex,
            user_id=user,
            question=question,
            route={"agent": self.agent.name},
            limits=parse_limits(limits, self.settings.default_limits),
            scope=scope.to_json(),
            versions=self.agent.versions(),
            agent_version=self.agent.agent_version,
            messages=messages,
        )

    async def claim(self, run_id: str, owner: str = OWNER) -> Run:
        """The run claimed by ``owner`` (it must be waiting for a worker)."""
        run = await hop(self.store.claim_ready, owner, run_id)
        assert run is not None, f"run {run_id} was not claimable"
        return run

    async def claimed(self, question: str = "go", *, limits: dict[str, Any] | None = None) -> Run:
        """A new run of dana's, claimed by this process."""
        return await self.claim((await self.new_run(question, limits=limits)).id)

    async def session(
        self, question: str = "go", *, limits: dict[str, Any] | None = None
    ) -> RunSession:
        """The session of a new run of dana's that this process just claimed."""
        return await RunSession.start(self.services, await self.claimed(question, limits=limits))

    async def turn(self, session: RunSession) -> list[ToolCall]:
        """Ask the model for the run's next turn and store it with the intents of its calls
        (the loop's first write of a step); its calls, to process one by one."""
        response = await self.model.request(list(session.messages), list(self.agent.tool_specs))
        turn = session.turn_of(response)
        await session.append_turn(turn)
        return turn.calls

    def take_over(self, session: RunSession) -> Run:
        """Another worker takes the run from under ``session`` (its lease moves on): the
        run is handed back out of band and claimed by ``RIVAL``."""
        self.store.release(session.lease, elapsed_ms=0, event={"why": "taken over"})
        run = self.store.claim_ready(RIVAL, session.run.id)
        assert run is not None and run.lease_epoch > session.lease.epoch
        return run

    # -- what the store holds -------------------------------------------------------------------

    def stored(self, run_id: str) -> Run:
        run = self.store.get_run(run_id)
        assert run is not None
        return run

    def messages(self, run_id: str) -> list[Message]:
        return self.store.messages(run_id)

    def results(self, run_id: str) -> list[Message]:
        """The tool results stored for the run, in order."""
        return [m for m in self.messages(run_id) if m.get("role") == "tool"]

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        return self.store.ledger(run_id)

    def events(self, run_id: str, kind: str | None = None) -> list[Event]:
        return [e for e in self.store.events(run_id) if kind is None or e.kind == kind]
