"""The engine a ``tether`` command works on: configured from the environment, with the
agent it names, its model and its notifier. Imported inside the commands that use an
engine (it imports the engine, the store and the agent's module), never at start-up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from dataclasses import replace
from typing import TypeVar

from tether.agent import Agent, load_agent
from tether.config import Settings, check_public_url
from tether.engine import Engine
from tether.errors import ConfigError
from tether.models.base import Message, Model, ModelResponse, ToolSpec
from tether.notify import LogNotifier, Notifier
from tether.telemetry import export
from tether.telemetry.logs import leave_out, show_content

T = TypeVar("T")

# What a command that needs no agent passes for ``--agent`` (``tether users``): the engine
# then serves a bare agent, with no tools and no lifespan, and imports none.
NO_AGENT = None


class NoModel(Model):
    """Stands in for a model in commands that never call one (migrate, approve, runs, ...)
    when neither ``TETHER_MODEL`` nor the agent names one."""

    name = "none"

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        raise ConfigError("set TETHER_MODEL (this agent has no default model)")


def pick_model(agent: Agent, settings: Settings, *, required: bool) -> Model:
    """``TETHER_MODEL``, else the agent's default model; ``required`` by commands that
    carry runs, so a missing model is a start-up error there."""
    model = agent.model_from(settings)
    if model is not None:
        return model
    if required:
        raise ConfigError("set TETHER_MODEL (this agent has no default model)")
    return NoModel()


def pick_notifier(settings: Settings) -> Notifier:
    """Suspension notices go to ``TETHER_WEBHOOK_URL``, or to the log."""
    if settings.webhook_url:
        from tether.webhook import WebhookNotifier

        return WebhookNotifier(settings.webhook_url)
    return LogNotifier(links=settings.log_approval_links, content=settings.log_content)


@asynccontextmanager
async def engine_for(
    agent_spec: str | None,
    *,
    serve_agent: bool = False,
    carries_runs: bool = False,
    migrate_empty: bool = False,
    public_url: str | None = None,
    own_url: str = "",
    brief: bool = False,
    interactive: bool = False,
) -> AsyncIterator[Engine]:
    """The process's one engine for ``agent_spec``, configured from the environment and
    opened. ``serve_agent`` enters the agent's lifespan first (what it needs running
    beside it, e.g. the demo's sandbox), for commands that call its tools or scope. Spans
    are exported over OTLP when the environment names an endpoint (``export.exporting``).
    Links in notices start with ``public_url`` (``--public-url``), else TETHER_PUBLIC_URL,
    else ``own_url`` (``serve``'s own address; none for other commands). A ``brief``
    process runs one command and exits (``Agent.running``); an ``interactive`` one, a
    command a person runs and waits for, does not wait for its database (``on_engine``)."""
    with export.exporting():
        base = check_public_url(public_url, "--public-url")
        settings = _settings(interactive=interactive)
        show_content(settings.log_content)  # the process's log handlers (``logs.py``)
        async with _engine(
            agent_spec,
            settings,
            serve_agent=serve_agent,
            carries_runs=carries_runs,
            migrate_empty=migrate_empty,
            public_url=base or settings.public_url or own_url,
            brief=brief,
        ) as e:
            yield e


@asynccontextmanager
async def _engine(
    agent_spec: str | None,
    settings: Settings,
    *,
    serve_agent: bool,
    carries_runs: bool,
    migrate_empty: bool,
    public_url: str,
    brief: bool,
) -> AsyncIterator[Engine]:
    loaded = _agent(agent_spec, settings)
    model = pick_model(loaded, settings, required=carries_runs)
    # A brief command's lifespan may use what a long-running process of the deployment
    # runs (the demo's sandbox) rather than start its own.
    async with loaded.running(brief=brief) if serve_agent else nullcontext(loaded) as agent:
        engine = Engine(
            agent=agent,
            model=model,
            settings=settings,
            notifier=pick_notifier(settings),
            migrate=migrate_empty,
            public_url=public_url,
        )
        async with engine:
            yield engine


def on_engine(
    agent_spec: str | None,
    action: Callable[[Engine], Awaitable[T]],
    *,
    serve_agent: bool = False,
    interactive: bool = True,
) -> T:
    """Run ``action`` on the engine of ``agent_spec``, in a fresh event loop: one command,
    brief (its agent's lifespan may use what a running ``serve`` or ``worker`` runs).

    An ``interactive`` command, one a person runs and waits for, fails at the first error
    reaching its database (a refused connection at once, one that is never answered at
    the connection timeout, 5 s) where a worker waits up to ``TETHER_DB_RETRY_S``; its one
    line of error names the database's host and port (``shared.unreachable``), so the
    store's log lines of retries stay out of its output."""

    async def go() -> T:
        async with engine_for(
            agent_spec, serve_agent=serve_agent, brief=True, interactive=interactive
        ) as engine:
            return await action(engine)

    return asyncio.run(go())


def migrate_database(agent_spec: str) -> None:
    """``tether migrate``: the schema brought up to this code's, then the agent's published
    users made sure of; an interactive command, as ``on_engine``'s are."""

    async def go() -> None:
        settings = _settings(interactive=True)
        loaded = load_agent(agent_spec, settings)
        model = pick_model(loaded, settings, required=False)
        engine = Engine(agent=loaded, model=model, settings=settings)
        try:
            await engine.operator.migrate()
        finally:
            await engine.aclose()

    asyncio.run(go())


def check_worker_start(agent_spec: str, public_url: str | None) -> None:
    """What a ``tether worker`` checks as it starts, done once by a supervisor before it
    starts its processes (``tether worker --processes N``), so that a mistake is one error
    (exit 1) rather than N processes failing and restarted: the agent and its model load,
    ``--public-url`` is one, and the schema is current, built in an empty database (so N
    processes never race to build it) and refused when older or newer."""

    async def go() -> None:
        async with engine_for(
            agent_spec, carries_runs=True, migrate_empty=True, public_url=public_url
        ):
            pass

    asyncio.run(go())


def _agent(agent_spec: str | None, settings: Settings) -> Agent:
    """The agent ``--agent`` names, or a bare one for ``NO_AGENT``."""
    if agent_spec is NO_AGENT:
        return Agent(name="tether", system_prompt="")
    return load_agent(agent_spec, settings)


def _settings(*, interactive: bool) -> Settings:
    """The environment's settings; for an ``interactive`` command (``on_engine``) without
    retries of the database, and without the store's log lines of them."""
    settings = Settings.from_env()
    if not interactive:
        return settings
    leave_out("db_retry", "db_unavailable")
    return replace(settings, db_retry_s=0.0)
