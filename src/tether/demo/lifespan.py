"""Serving the demo agent when no sandbox is configured: its lifespan starts the sandbox
CRM in-process, so ``tether serve`` (and ``worker``, ``demo``) work with nothing else
running, as the README's walkthrough expects; and a command a person runs beside them
(``tether approve``) uses the sandbox they serve instead of starting one for itself."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, suppress
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tether import Agent
from tether.demo.crm import Crm, no_tls

log = logging.getLogger(__name__)

SANDBOX_DB = "sandbox.db"

Lifespan = Callable[..., AbstractAsyncContextManager[Agent]]


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
    ``db_path``, serves ``rewire(agent, crm)`` pointed at it, and stops it on the way out.
    A long-running process (``serve``, ``worker``) says where it serves that data
    (``advertised``); a ``brief`` one (a command a person runs) uses that sandbox if it
    answers, rather than start one of its own for one command."""

    @asynccontextmanager
    async def lifespan(agent: Agent, *, brief: bool = False) -> AsyncIterator[Agent]:
        configured = agent.deps if isinstance(agent.deps, Crm) else Crm()
        if configured.base_url is not None:
            yield agent
            return
        where = db_path.resolve()
        if brief and (url := await asyncio.to_thread(served_at, where)) is not None:
            yield rewire(agent, Crm(base_url=url, timeout_s=configured.timeout_s))
            return
        from tether.demo.sandbox import start_in_thread  # FastAPI and uvicorn: only here

        running = await asyncio.to_thread(start_in_thread, str(where))
        log.info(
            "no TETHER_SANDBOX_URL: started the demo sandbox in-process at %s (its data in %s)",
            running.url,
            where,
            extra={"action": "sandbox_started", "url": running.url, "db_path": str(where)},
        )
        with advertised(where, running.url, brief=brief):
            try:
                yield rewire(agent, Crm(base_url=running.url, timeout_s=configured.timeout_s))
            finally:
                await asyncio.to_thread(running.stop)
                log.info("demo sandbox stopped", extra={"action": "sandbox_stopped"})

    return lifespan


def advert_of(db_path: Path) -> Path:
    """Where a process serving the sandbox's data at ``db_path`` says so: beside it."""
    return db_path.with_name(db_path.name + ".serving")


@contextmanager
def advertised(db_path: Path, url: str, *, brief: bool) -> Iterator[None]:
    """While inside, unless ``brief``, ``advert_of(db_path)`` names ``url`` and this
    process (written whole or not at all); taken back on the way out unless another
    process has written its own since."""
    if brief:
        yield
        return
    advert = advert_of(db_path)
    mine = json.dumps({"url": url, "pid": os.getpid()})
    written = advert.with_name(f"{advert.name}.{os.getpid()}")
    written.write_text(mine)
    os.replace(written, advert)
    try:
        yield
    finally:
        with suppress(OSError):
            if advert.read_text() == mine:
                advert.unlink()


def served_at(db_path: Path) -> str | None:
    """The URL of the sandbox another process serves on the data at ``db_path``, if its
    advert names a live process and the URL answers now; else None (one that was killed
    left its advert behind: it is ignored)."""
    import httpx

    try:
        advert = json.loads(advert_of(db_path).read_text())
        url, pid = str(advert["url"]), int(advert["pid"])
        os.kill(pid, 0)  # the process is alive (a signal 0 checks only that)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        answered = httpx.get(f"{url}/healthz", timeout=1.0, verify=no_tls())
    except httpx.HTTPError:
        return None
    return url if answered.status_code == 200 else None
