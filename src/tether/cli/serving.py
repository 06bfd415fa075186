"""The long-running commands, ``tether worker`` and ``tether serve``: one engine, its worker
(and the HTTP layer), stopped by SIGTERM or SIGINT. Imported by those commands only."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

from tether.cli.supervisor import follow_supervisor
from tether.cli.wiring import engine_for
from tether.engine import Engine
from tether.telemetry.content import failure
from tether.worker import Worker

log = logging.getLogger(__name__)


def run_worker(
    agent: str, concurrency: int, *, exit_when_idle: bool, reap: bool, public_url: str | None
) -> None:
    """``tether worker``: carry runs of ``agent`` until stopped (or idle); a process of a
    supervisor's ends with it (``follow_supervisor``)."""
    follow_supervisor()

    async def go() -> None:
        async with engine_for(
            agent, serve_agent=True, carries_runs=True, migrate_empty=True, public_url=public_url
        ) as engine:
            _warn_of_relative_links(engine)
            runner = Worker(engine, concurrency=concurrency)
            _started()
            with _signals(runner.stop):
                await runner.run(exit_when_idle=exit_when_idle, reap=reap)

    with asyncio.Runner(loop_factory=_worker_loop()) as loop:
        loop.run(go())


def _worker_loop() -> Callable[[], asyncio.AbstractEventLoop]:
    """The worker's event loop: uvloop's where it is installed (it is a dependency but on
    Windows). A process carrying thousands of runs spends a good part of its core
    scheduling their callbacks, and libuv's loop takes less of it per step than asyncio's
    (docs/operations.md "Capacity")."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def _warn_of_relative_links(engine: Engine) -> None:
    """A worker has no address of its own: without a public URL, the links in the notices
    it posts to a webhook have no host. Said once, at start."""
    if engine.settings.webhook_url and not engine.public_url:
        log.warning(
            "notices go to TETHER_WEBHOOK_URL with approval links that have no host "
            "(/approve/...): set TETHER_PUBLIC_URL or --public-url to the URL people reach "
            "`tether serve` at",
            extra={"action": "worker"},
        )


def serve_api(
    agent: str, host: str, port: int, public_url: str | None, slots: int, *, own_url: str
) -> None:
    """``tether serve``: the HTTP API and ``slots`` worker slots on one engine; links in
    notices start with ``public_url`` (the flag), else TETHER_PUBLIC_URL, else ``own_url``."""
    asyncio.run(_serve(agent, host, port, public_url, slots, own_url))


# The collector's thresholds in a serving process (Python's are 700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 10)


def _started() -> None:
    """Start-up is over: what it built (modules, the agent, the engine, the app) lives as
    long as the process, so it leaves the garbage collector's generations. A full
    collection then walks only what runs and requests allocate: with them it was the
    whole tail of concurrent approvals' latency (the throughput benchmark,
    benchmarks/README.md).

    The young generations are made larger: a model request's objects (the SDK's and the
    HTTP client's, in reference cycles) live as long as the request, a second or more,
    and with Python's thresholds they were promoted to the oldest generation before they
    died, so that a worker carrying many runs kept making full collections of its whole
    heap, every run waiting on each (the capacity benchmark, benchmarks/README.md)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _serve(
    agent_spec: str, host: str, port: int, flag: str | None, slots: int, own_url: str
) -> None:
    """Uvicorn and the worker in one event loop on one engine; the worker carries
    ``slots`` runs at once (``--workers`` times ``--concurrency``) and stops with the server."""
    import uvicorn

    from tether.api.app import create_app
    from tether.api.server import for_many_connections, server_config

    files = for_many_connections(asyncio.get_running_loop())

    async with engine_for(
        agent_spec,
        serve_agent=True,
        carries_runs=slots > 0,
        migrate_empty=True,
        public_url=flag,
        own_url=own_url,
    ) as engine:
        base = engine.public_url
        await engine.operator.ensure_agent_users()
        app = create_app(engine, public_url=base)
        server = uvicorn.Server(server_config(app, host, port, engine.settings))
        runner = Worker(engine, concurrency=slots) if slots else None
        task = asyncio.create_task(runner.run()) if runner else None
        died: list[str] = []

        def on_signal() -> None:
            # Uvicorn installs its own handlers while it serves and raises the signal again
            # once it has stopped; this runs either way (and must stay idempotent), so a
            # signal never kills the process before the worker has stopped.
            server.should_exit = True
            if runner is not None:
                runner.stop()

        def on_worker_end(done: asyncio.Task[None]) -> None:
            # The worker outlives database outages; if it ends anyway while serving, the
            # process must not look healthy: unready at once, then exit non-zero.
            if runner is None or runner.stopping.is_set():
                return
            error = done.exception() if not done.cancelled() else None
            reason = f"{type(error).__name__}: {error}" if error else "it returned"
            died.append(reason)
            app.state.unready = f"the worker stopped ({reason})"
            if error is None:
                log.critical("the worker stopped; shutting down", extra={"action": "serve"})
            else:
                told = failure(error, engine.settings.log_content, action="serve")
                log.critical("the worker stopped; shutting down", **told)
            server.should_exit = True

        if task is not None:
            task.add_done_callback(on_worker_end)
        _started()
        extra = {"action": "serve", "url": base, "worker_slots": slots, **files}
        log.info("serving", extra=extra)
        with _signals(on_signal):
            try:
                await server.serve()
            finally:
                on_signal()
                if task is not None:
                    await asyncio.gather(task, return_exceptions=True)
        if died:
            raise typer.Exit(1)


@contextmanager
def _signals(handler: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``handler`` while inside; the defaults come back after."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
