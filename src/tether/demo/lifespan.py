"""Serving the demo agent when no sandbox is configured: its lifespan starts the sandbox
CRM in-process, so ``tether serve`` (and ``worker``, ``demo``) work with nothing else
running, as the README's walkthrough expects."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tether import Agent
from tether.demo.crm import Crm

log = logging.getLogger(__name__)

SANDBOX_DB = "sandbox.db"

Lifespan = Callable[[Agent], AbstractAsyncContextManager[Agent]]


def sandbox_db_for(database_url: str) -> Path:
    """Where an in-process sandbox keeps its data: beside a SQLite tether database, so
    every process on that database (``serve``, ``worker``, ``approve``) sees the same CRM;
    otherwise in the working folder, where ``tether sandbox serve`` keeps it too."""
    try:
        url = make_url(database_url)
    except (ArgumentError, ValueError):  # the store reports a malformed URL itself
        return Path(SANDBOX_DB)
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database not in ("", ":memory:"):
        return Path(database).parent / SANDBOX_DB
    return Path(SANDBOX_DB)


def sandbox_lifespan(db_path: Path, rewire: Callable[[Agent, Crm], Agent]) -> Lifespan:
    """The demo agent's lifespan: with a configured sandbox URL it serves the agent as it
    is; without one it starts the sandbox on a free loopback port with its data in
    ``db_path``, serves ``rewire(agent, crm)`` pointed at it, and stops it on the way out."""

    @asynccontextmanager
    async def lifespan(agent: Agent) -> AsyncIterator[Agent]:
        configured = agent.deps if isinstance(agent.deps, Crm) else Crm()
        if configured.base_url is not None:
            yield agent
            return
        from tether.demo.sandbox import start_in_thread  # FastAPI and uvicorn: only here

        where = db_path.resolve()
        running = await asyncio.to_thread(start_in_thread, str(where))
        log.info(
            "no TETHER_SANDBOX_URL: started the demo sandbox in-process at %s (its data in %s)",
            running.url,
            where,
            extra={"action": "sandbox_started", "url": running.url, "db_path": str(where)},
        )
        try:
            yield rewire(agent, Crm(base_url=running.url, timeout_s=configured.timeout_s))
        finally:
            await asyncio.to_thread(running.stop)
            log.info("demo sandbox stopped", extra={"action": "sandbox_stopped"})

    return lifespan
