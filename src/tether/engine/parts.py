"""What an ``Engine`` is built of: the store, the services every run shares, the live
event feed, and how they are released when the engine closes."""

from __future__ import annotations

from tether._runtime.live import deltas
from tether._runtime.live.events import Feed
from tether._runtime.shared.heartbeat import Heartbeat
from tether._runtime.shared.model_rate_limiter import RateLimiter
from tether._runtime.shared.services import Services
from tether.agent import Agent
from tether.budget import Limits, within_cap
from tether.config import Settings
from tether.errors import ConfigError, InvalidInput
from tether.models.base import Model
from tether.notify import LogNotifier, Notifier, Outbox
from tether.store import Store
from tether.tools import deciders

# How long closing an engine waits for queued notices to go out.
NOTICE_DRAIN_S = 5.0


def check_subagent_limits(agent: Agent, cap: Limits) -> None:
    """Refuse, before anything starts, a sub-agent whose declared limits pass the configured
    cap (``TETHER_MAX_LIMITS``): every child of it would be refused (reference §18)."""
    for sub in (tool for member in agent.tree.values() for tool in member.subagents):
        if sub.child_limits is None:
            continue
        try:
            within_cap(sub.limits_for(cap), cap, f"the limits {sub.name} declares")
        except InvalidInput as exc:
            raise ConfigError(f"agent {agent.name}: {exc.message}") from exc


def check_escalations(agent: Agent, window_min: float) -> None:
    """Refuse a tool whose escalation would come after this engine's suspension window
    (``TETHER_SUSPENSION_TTL_MIN``): the window ends the suspension first (reference §19)."""
    for member in agent.tree.values():
        for tool in member.tools:
            if tool.escalate_after_min is not None:
                deciders.check_escalation(
                    tool.name,
                    tool.escalate_after_min,
                    tool.escalate_to,
                    confirms=tool.may_confirm,
                    window_min=window_min,
                )


class Parts:
    """The store and the services of one engine, built without I/O."""

    def __init__(
        self,
        *,
        agent: Agent,
        model: Model,
        settings: Settings,
        database_url: str | None,
        listen_database_url: str | None,
        notifier: Notifier | None,
        public_url: str | None,
    ) -> None:
        check_subagent_limits(agent, settings.max_limits)
        check_escalations(agent, settings.suspension_ttl_min)
        if listen_database_url is None and database_url is None:
            listen_database_url = settings.listen_database_url  # of the same database
        self.store = Store(
            database_url or settings.database_url,
            listen_url=listen_database_url,
            heartbeat_refresh_s=settings.heartbeat_timeout_s / 3,
            retry_s=settings.db_retry_s,
            keyring=settings.keyring,
        )
        self.events = Feed(self.store, poll_s=settings.watch_poll_s)
        base = ((settings.public_url if public_url is None else public_url) or "").rstrip("/")
        self.public_url = base
        notifier = notifier or LogNotifier(
            links=settings.log_approval_links, content=settings.log_content
        )
        self.services = Services(
            store=self.store,
            agent=agent,
            model=model,
            settings=settings,
            notifier=notifier,
            heartbeat=Heartbeat(self.store, settings.heartbeat_timeout_s / 3),
            outbox=Outbox(
                notifier,
                self.store,
                timeout_s=settings.notice_timeout_s,
                content=settings.log_content,
            ),
            approve_url=lambda token: f"{base}/approve/{token}",
            feed=self.events,
            deltas=deltas.hub_for(self.store),
            limiter=RateLimiter.of(self.store, settings),
        )
        self._hub_released = False

    def close(self) -> None:
        """Stop the heartbeat and the notice senders, and release the database
        connections."""
        services = self.services
        try:
            services.heartbeat.stop()
            services.limiter.close()
            services.outbox.stop()
            self.events.stop()
            if not self._hub_released and services.deltas is not None:
                self._hub_released = True
                deltas.release(services.deltas)
        finally:
            self.store.close()

    async def aclose(self) -> None:
        """Give queued notices a moment to go out, then release the model's client and
        the database connections."""
        await self.services.outbox.drain(NOTICE_DRAIN_S)
        await self.services.model.aclose()
        self.close()
