"""The ``tether`` command line (reference §6). It uses nothing but the ``Engine``; the demo is
only named, as the default ``--agent``."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from tether.agent import load_agent
from tether.cli.runs import runs_app
from tether.cli.wiring import (
    DEFAULT_AGENT,
    DEMO_SANDBOX,
    DEMO_STORY,
    AgentOpt,
    demo_entry,
    emit,
    engine_for,
    on_engine,
    out,
    pick_model,
)
from tether.config import Settings
from tether.engine import Engine
from tether.errors import InvalidInput, TetherError, UnknownOrExpired
from tether.runs import run_to_json
from tether.telemetry.logs import configure

T = TypeVar("T")
log = logging.getLogger(__name__)

app = typer.Typer(help="tether: agent runs that survive interruption.", no_args_is_help=True)
sandbox_app = typer.Typer(help="The demo business system.", no_args_is_help=True)
users_app = typer.Typer(help="Users and their API keys.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(users_app, name="users")

err = Console(stderr=True)


def main() -> None:
    """Entry point: run the CLI, turning tether's errors into a message and exit 1."""
    try:
        app()
    except TetherError as exc:
        err.print(f"[red]error[/red] {exc.code}: {exc.message}")
        sys.exit(1)


# -- building the one engine of a process --------------------------------------------------


# -- carrying runs -------------------------------------------------------------------------


@app.command()
def worker(
    agent: AgentOpt = DEFAULT_AGENT,
    concurrency: Annotated[int, typer.Option(min=1, max=1000, help="runs carried at once")] = 8,
    exit_when_idle: Annotated[
        bool, typer.Option(help="exit once no run waits and none is in hand")
    ] = False,
    reap: Annotated[bool, typer.Option(help="run the reaper on its interval")] = True,
) -> None:
    """Claim runs that wait for a worker and carry them to their next stop. With the demo
    agent and no TETHER_SANDBOX_URL it starts its own sandbox on the shared sandbox data
    (see the log)."""
    configure("INFO")
    from tether.worker import Worker

    async def go() -> None:
        async with engine_for(
            agent, serve_agent=True, carries_runs=True, migrate_empty=True
        ) as engine:
            runner = Worker(engine, concurrency=concurrency)
            _started()
            with _signals(runner.stop):
                await runner.run(exit_when_idle=exit_when_idle, reap=reap)

    asyncio.run(go())


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to bind")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=0, max=64, help="workers: N x --concurrency runs at once (0: the API alone)"
        ),
    ] = 1,
    agent: AgentOpt = DEFAULT_AGENT,
    public_url: Annotated[
        str | None,
        typer.Option(help="base URL of approval links in notices (default http://HOST:PORT)"),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, max=1000, help="runs each worker carries at once")
    ] = 8,
) -> None:
    """Serve the HTTP API and the approvals pages, with workers in the same process, all on
    one engine. With the demo agent and no TETHER_SANDBOX_URL the sandbox starts
    in-process (see the log). SIGTERM or SIGINT stops accepting requests and claiming
    runs; once the runs in hand are finished or handed back, the process exits 0."""
    configure("INFO")
    base = (public_url or f"http://{_url_host(host)}:{port}").rstrip("/")
    asyncio.run(_serve(agent, host, port, base, workers * concurrency))


def _started() -> None:
    """Start-up is over: what it built (modules, the agent, the engine, the app) lives as
    long as the process, so it leaves the garbage collector's generations. A full
    collection then walks only what runs and requests allocate: it took 50-126 ms with
    them, the whole tail of 50 concurrent approvals' latency (benchmarks/README.md)."""
    gc.freeze()


async def _serve(agent_spec: str, host: str, port: int, base: str, slots: int) -> None:
    """Uvicorn and the worker in one event loop on one engine; the worker carries
    ``slots`` runs at once (``--workers`` times ``--concurrency``) and stops with the server."""
    import uvicorn

    from tether.api.app import create_app
    from tether.worker import Worker

    async with engine_for(
        agent_spec, serve_agent=True, carries_runs=slots > 0, migrate_empty=True, public_url=base
    ) as engine:
        await engine.ensure_agent_users()
        app = create_app(engine, public_url=base)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None))
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
            log.critical(
                "the worker stopped; shutting down",
                exc_info=error,
                extra={"action": "serve", "error": reason[:500]},
            )
            server.should_exit = True

        if task is not None:
            task.add_done_callback(on_worker_end)
        _started()
        log.info("serving", extra={"action": "serve", "url": base, "worker_slots": slots})
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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@app.command()
def reap(agent: AgentOpt = DEFAULT_AGENT) -> None:
    """One reaper pass: recover orphans (reconcile, hand back to the workers), expire
    suspensions, purge past retention."""
    configure("WARNING")
    report = on_engine(agent, lambda engine: engine.reap(), serve_agent=True)
    emit(report.to_json())


# -- deciding and steering runs ------------------------------------------------------------


@app.command()
def approve(
    token: str,
    decline: Annotated[bool, typer.Option("--decline", help="decline instead")] = False,
    reason: Annotated[str | None, typer.Option(help="why (the model sees it on a decline)")] = None,
    arguments: Annotated[
        str | None, typer.Option(help="approve with these edited arguments (a JSON object)")
    ] = None,
    digest: Annotated[
        str | None, typer.Option(help="the digest of the preview approved (of the edit)")
    ] = None,
    as_user: Annotated[
        str | None, typer.Option("--as", help="act as this user (default: the run's owner)")
    ] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Decide a pending request. Exit 0 when the decision took effect, 1 when refused."""
    configure("WARNING")
    decision = "decline" if decline else "approve"

    async def decide(engine: Engine) -> dict[str, Any] | TetherError:
        try:
            edited = None if arguments is None else _json_arg(arguments, "--arguments")
            approver = as_user or await engine.token_owner(token)
            if approver is None:
                raise UnknownOrExpired("this token is unknown or expired")
            result = await engine.resume_after_confirmation(
                token, decision, approver, reason=reason, arguments=edited, digest=digest
            )
        except TetherError as exc:
            return exc
        return result.to_json()

    answer = on_engine(agent, decide, serve_agent=True)
    if isinstance(answer, TetherError):
        err.print(f"[red]refused[/red] {answer.code}: {answer.message}")
        emit(answer.to_dict())
        raise typer.Exit(1)
    emit(answer)


def _json_arg(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{option} must be JSON: {exc}") from exc


@app.command("continue")
def continue_(
    run_id: str,
    as_user: Annotated[
        str | None, typer.Option("--as", help="the run's owner (default: the run's owner)")
    ] = None,
    why: Annotated[str | None, typer.Option(help="why more budget is granted")] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Continue a halted run with the default grant; a worker carries it on."""
    configure("WARNING")

    async def go(engine: Engine) -> dict[str, Any]:
        user = as_user or (await engine.get_run(run_id)).run.user_id
        run = await engine.continue_run(run_id, user, why=why or "operator continue")
        return run_to_json(run)

    emit(on_engine(agent, go, serve_agent=True))


@app.command()
def cancel(
    run_id: str,
    as_user: Annotated[str | None, typer.Option("--as", help="the run's owner")] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Cancel a run that is not terminal."""
    configure("WARNING")

    async def go(engine: Engine) -> dict[str, Any]:
        user = as_user or (await engine.get_run(run_id)).run.user_id
        return run_to_json(await engine.cancel_run(run_id, user))

    emit(on_engine(agent, go))


# -- the database and its users ------------------------------------------------------------


@app.command()
def migrate(agent: AgentOpt = DEFAULT_AGENT) -> None:
    """Apply the database migrations (TETHER_DATABASE_URL) and make sure the agent's
    published users (the demo's dana and miguel) exist with their keys."""
    configure("WARNING")

    async def go() -> None:
        settings = Settings.from_env()
        loaded = load_agent(agent, settings)
        model = pick_model(loaded, settings, required=False)
        engine = Engine(agent=loaded, model=model, settings=settings)
        try:
            await engine.migrate()
        finally:
            await engine.aclose()

    asyncio.run(go())
    out.print("[green]migrated[/green]")


@users_app.command("add")
def users_add(name: str, agent: AgentOpt = DEFAULT_AGENT) -> None:
    """Create a user (if new) and print a new API key for it; the key is shown once."""
    configure("WARNING")
    typer.echo(on_engine(agent, lambda engine: engine.add_user(name)))


# -- the demo ------------------------------------------------------------------------------


@sandbox_app.command("serve")
def sandbox_serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8100,
    db: Annotated[str, typer.Option(help="the sandbox's database file")] = "./sandbox.db",
) -> None:
    """Serve the sandbox business system the demo's tools call."""
    configure("INFO")
    demo_entry(DEMO_SANDBOX)(host=host, port=port, db_path=db)


@app.command()
def demo() -> None:
    """Tell the whole story with real runs: suspension and approval, a crash, a budget
    halt, and the stale approval refused. Exits non-zero if any scene differs."""
    raise typer.Exit(demo_entry(DEMO_STORY)())
