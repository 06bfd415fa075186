"""What every run session shares within one engine: store, agent, model, settings, the
heartbeat of the leases it holds, the outbox of its notices, the hub of the model's text
as it is written and the limiter of the fleet's model rate."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

from tether._runtime.live.deltas import DeltaHub
from tether._runtime.live.events import Feed
from tether._runtime.shared.heartbeat import Heartbeat
from tether._runtime.shared.model_rate_limiter import RateLimiter
from tether._runtime.shared.pacing import Pacer
from tether._runtime.single_flight import InFlight
from tether.agent import Agent
from tether.config import Settings
from tether.models.base import Model
from tether.models.fallback import ModelList
from tether.notify import Notifier, Outbox
from tether.runs import Run
from tether.store import Store


@dataclass(frozen=True, kw_only=True)
class Services:
    """The engine's parts a session, a call and a resumption need."""

    store: Store
    agent: Agent
    model: Model
    settings: Settings
    notifier: Notifier
    heartbeat: Heartbeat
    outbox: Outbox
    approve_url: Callable[[str], str] = field(default=lambda token: f"/approve/{token}")
    # Concurrent lookups and claims of one token in this process, sent once (decided_call.py).
    single_flight: InFlight = field(default_factory=InFlight)
    # The live event streams of this engine's watchers (reference §11); None: none here.
    feed: Feed | None = None
    # Where the model's text goes as it is written (reference §16); None: nowhere.
    deltas: DeltaHub | None = None
    # Set when this process adds a schedule, so its ticking wakes for it (reference §13).
    schedules_added: asyncio.Event = field(default_factory=asyncio.Event)
    # The fleet's model rate (reference §13, ``model_rate_limiter.py``); off: no limit, no cost.
    limiter: RateLimiter = field(default_factory=RateLimiter.off)
    # The model requests in flight in this process, bounded by its event loop's lag
    # (``pacing.py``).
    pacer: Pacer = field(default_factory=Pacer)

    @cached_property
    def models(self) -> ModelList:
        """The engine's model as a list (one model is a list of one), made once rather than
        at every model call."""
        return ModelList.of(self.model)

    @property
    def versions(self) -> tuple[str, ...]:
        """The agent versions this process serves (reference §12): its agent's and its
        sub-agents' (§18), then those ``TETHER_ACCEPT_VERSIONS`` adds. It claims, recovers
        and decides only runs of these."""
        own = tuple(self.agent.tree)
        return (*own, *(v for v in self.settings.accept_versions if v not in own))

    def serving(self, run: Run) -> Services:
        """These services with the agent of its tree that ``run`` is written for (a child
        run's sub-agent: its prompt, tools and scope), the same parts otherwise."""
        agent = self.agent.agent_of(run.agent_version)
        return self if agent is self.agent else replace(self, agent=agent)
