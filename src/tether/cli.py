"""The ``tether`` command line (SPEC §6)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tether.agent import load_agent
from tether.config import Settings
from tether.engine import Engine
from tether.errors import ConfigError, TetherError
from tether.logs import configure
from tether.notify import LogNotifier, Notifier
from tether.runs import iso, run_to_json

DEFAULT_AGENT = "tether.sandbox.agent:build_agent"

app = typer.Typer(help="tether: agent runs that survive interruption.", no_args_is_help=True)
runs_app = typer.Typer(help="Read runs.", no_args_is_help=True)
sandbox_app = typer.Typer(help="The demo business system.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(sandbox_app, name="sandbox")

out = Console()
err = Console(stderr=True)

AgentOpt = Annotated[
    str, typer.Option("--agent", help="MODULE:ATTR of the agent (default: the demo agent)")
]


def main() -> None:
    """Entry point: run the CLI, turning tether's errors into a message and exit 1."""
    try:
        app()
    except TetherError as exc:
        err.print(f"[red]error[/red] {exc.code}: {exc.message}")
        sys.exit(1)


def build_engine(
    agent_spec: str,
    *,
    migrate_empty: bool,
    notifier: Notifier | None = None,
    public_url: str = "",
) -> Engine:
    """An engine for the agent ``agent_spec`` configured from the environment;
    ``public_url`` prefixes the approval links of its notices."""
    settings = Settings.from_env()
    agent = load_agent(agent_spec)
    if settings.model:
        from tether.models import from_spec

        model = from_spec(settings.model)
    elif agent.default_model is not None:
        model = agent.default_model()
    else:
        raise ConfigError("set TETHER_MODEL (this agent has no default model)")
    if notifier is None:
        if settings.webhook_url:
            from tether.webhook import WebhookNotifier

            notifier = WebhookNotifier(settings.webhook_url)
        else:
            notifier = LogNotifier()
    return Engine(
        agent=agent,
        model=model,
        settings=settings,
        notifier=notifier,
        migrate=migrate_empty,
        public_url=public_url,
    )


def _emit(data: Any) -> None:
    out.print_json(json.dumps(data, default=str))


@app.command()
def migrate(agent: AgentOpt = DEFAULT_AGENT) -> None:
    """Apply the database migrations (TETHER_DATABASE_URL)."""
    configure("WARNING")
    from tether.store import Store, upgrade

    store = Store(Settings.from_env().database_url)
    try:
        upgrade(store.engine)
        if agent == DEFAULT_AGENT:
            from tether.users import ensure_demo_users

            ensure_demo_users(store)
    finally:
        store.close()
    out.print("[green]migrated[/green]")


@app.command()
def worker(
    agent: AgentOpt = DEFAULT_AGENT,
    concurrency: Annotated[int, typer.Option(min=1, max=1000, help="runs carried at once")] = 8,
    exit_when_idle: Annotated[
        bool, typer.Option(help="exit once no run waits and none is in hand")
    ] = False,
    reap: Annotated[bool, typer.Option(help="run the reaper on its interval")] = True,
) -> None:
    """Claim runs that wait for a worker and carry them to their next stop."""
    configure("INFO")
    from tether.worker import Worker

    engine = build_engine(agent, migrate_empty=True)
    runner = Worker(engine, concurrency=concurrency)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runner.stop)
        await runner.run(exit_when_idle=exit_when_idle, reap=reap)

    try:
        asyncio.run(go())
    finally:
        engine.close()


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to bind")] = 8000,
    workers: Annotated[
        int, typer.Option(min=0, max=64, help="in-process workers (0: the API alone)")
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
    """Serve the HTTP API and the approvals pages, with workers in the same process.
    SIGTERM or SIGINT stops accepting requests and claiming runs; once the workers have
    finished or handed back the runs in hand, the process exits 0."""
    configure("INFO")
    base = (public_url or f"http://{_url_host(host)}:{port}").rstrip("/")
    api_engine = build_engine(agent, migrate_empty=True, public_url=base)
    engines = [api_engine]
    try:
        if agent == DEFAULT_AGENT:
            from tether.users import ensure_demo_users

            ensure_demo_users(api_engine.store)
        for _ in range(workers):
            engines.append(build_engine(agent, migrate_empty=False, public_url=base))
        asyncio.run(_serve(api_engine, engines[1:], host, port, base, concurrency))
    finally:
        for engine in engines:
            engine.close()


async def _serve(
    api_engine: Engine,
    worker_engines: list[Engine],
    host: str,
    port: int,
    public_url: str,
    concurrency: int,
) -> None:
    """Uvicorn and the workers in one event loop; the workers stop when the server does."""
    import uvicorn

    from tether.api.app import create_app
    from tether.worker import Worker

    app = create_app(api_engine, public_url=public_url)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None))
    runners = [Worker(engine, concurrency=concurrency) for engine in worker_engines]
    tasks = [asyncio.create_task(runner.run()) for runner in runners]

    def on_signal() -> None:
        # Uvicorn installs its own handlers while it serves and raises the signal again
        # once it has stopped; this runs either way (and must stay idempotent), so a
        # signal never kills the process before the workers have stopped.
        server.should_exit = True
        for runner in runners:
            runner.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await server.serve()
    finally:
        for runner in runners:
            runner.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@app.command()
def reap(agent: AgentOpt = DEFAULT_AGENT) -> None:
    """One reaper pass: recover orphans (reconcile, hand back to the workers), expire
    suspensions, purge past retention."""
    configure("WARNING")
    engine = build_engine(agent, migrate_empty=False)
    try:
        _emit(asyncio.run(engine.reap()))
    finally:
        engine.close()


@app.command()
def approve(
    token: str,
    decline: Annotated[bool, typer.Option("--decline", help="decline instead")] = False,
    as_user: Annotated[
        str | None, typer.Option("--as", help="act as this user (default: the run's owner)")
    ] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Decide a pending request. Exit 0 when the decision took effect, 1 when refused."""
    configure("WARNING")
    engine = build_engine(agent, migrate_empty=False)
    decision = "decline" if decline else "approve"
    try:
        approver = as_user or asyncio.run(engine.owner_of_token(token))
        if approver is None:
            err.print("[red]refused[/red] unknown_or_expired: this token is unknown or expired")
            raise typer.Exit(1)
        result = asyncio.run(engine.resume_after_confirmation(token, decision, approver))
        _emit(result.to_json())
    except TetherError as exc:
        err.print(f"[red]refused[/red] {exc.code}: {exc.message}")
        _emit(exc.to_dict())
        raise typer.Exit(1) from exc
    finally:
        engine.close()


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
    engine = build_engine(agent, migrate_empty=False)
    try:
        user = as_user or _owner(engine, run_id)
        run = asyncio.run(engine.continue_run(run_id, user, why=why or "operator continue"))
        _emit(run_to_json(run))
    finally:
        engine.close()


@app.command()
def cancel(
    run_id: str,
    as_user: Annotated[str | None, typer.Option("--as", help="the run's owner")] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Cancel a run that is not terminal."""
    configure("WARNING")
    engine = build_engine(agent, migrate_empty=False)
    try:
        user = as_user or _owner(engine, run_id)
        _emit(run_to_json(asyncio.run(engine.cancel_run(run_id, user))))
    finally:
        engine.close()


@runs_app.command("list")
def runs_list(
    user: Annotated[str | None, typer.Option(help="only this user's runs")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """List runs, newest first."""
    configure("WARNING")
    engine = build_engine(agent, migrate_empty=False)
    try:
        found = asyncio.run(engine.list_runs(user, limit))
    finally:
        engine.close()
    table = Table("id", "user", "state", "step", "reason", "spend $", "updated")
    for run in found:
        table.add_row(
            run.id,
            run.user_id,
            run.state.value,
            str(run.step),
            run.halt_reason or run.fail_reason or "",
            f"{run.budget.spend_usd:.4f}",
            iso(run.updated_at) or "",
        )
    out.print(table)


@runs_app.command("show")
def runs_show(run_id: str, agent: AgentOpt = DEFAULT_AGENT) -> None:
    """Show a run with its budget, pending request and messages."""
    configure("WARNING")
    engine = build_engine(agent, migrate_empty=False)
    try:
        view = asyncio.run(engine.get_run(run_id))
    finally:
        engine.close()
    _emit({**run_to_json(view.run), "messages": view.messages})


@sandbox_app.command("serve")
def sandbox_serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8100,
    db: Annotated[str, typer.Option(help="the sandbox's database file")] = "./sandbox.db",
) -> None:
    """Serve the sandbox business system the demo's tools call."""
    configure("INFO")
    from tether.sandbox.server import serve

    serve(host=host, port=port, db_path=db)


def _owner(engine: Engine, run_id: str) -> str:
    run = engine.store.get_run(run_id)
    if run is None:
        from tether.errors import NotFound

        raise NotFound("no such run")
    return run.user_id


@app.command()
def demo() -> None:
    """Tell the whole story with real runs: suspension and approval, a crash, a budget
    halt, and the stale approval refused. Exits non-zero if any scene differs."""
    from tether.demo import main as run_demo

    raise typer.Exit(run_demo())


users_app = typer.Typer(help="Users and their API keys.", no_args_is_help=True)
app.add_typer(users_app, name="users")


@users_app.command("add")
def users_add(name: str) -> None:
    """Create a user (if new) and print a new API key for it; the key is shown once."""
    configure("WARNING")
    from tether.store import Store
    from tether.users import add_user

    store = Store(Settings.from_env().database_url)
    try:
        from tether.store import ensure_schema

        ensure_schema(store.engine, migrate_empty=False)
        out.print(add_user(store, name))
    finally:
        store.close()
