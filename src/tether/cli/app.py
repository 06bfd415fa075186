"""The ``tether`` command line (reference §6). It uses nothing but the ``Engine``; the demo is
only named, as the default ``--agent`` and by the commands that run it.

Start-up imports Typer, Rich and nothing of the engine: each command imports what it uses
(the engine, the worker, the HTTP layer) when it runs, so ``tether --help`` and a command
that reads one run do not pay for the rest (tests/unit/test_lazy_imports.py)."""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tether.cli.approvals import approvals_app
from tether.cli.audit import audit_app
from tether.cli.keys import keys_app
from tether.cli.runs import runs_app
from tether.cli.schedules import schedules_app
from tether.cli.shared import (
    DEFAULT_AGENT,
    AgentOpt,
    IgnoredAgentOpt,
    OwnerOpt,
    emit,
    limits_arg,
    named,
    out,
    say_error,
    unreachable,
)
from tether.cli.threads import ask, threads_app
from tether.cli.users import MaxPriorityOpt, RetentionDaysOpt, users_app
from tether.errors import (
    DatabaseMisconfigured,
    DatabaseUnavailable,
    InvalidInput,
    TetherError,
)
from tether.telemetry.logs import configure

if TYPE_CHECKING:
    from tether.engine import Engine

# The demo's entry points, named like the default ``--agent``.
DEMO_STORY = "tether.demo.story:main"
SANDBOX_SERVE = "tether.demo.sandbox.server:serve"
# The most runs one worker may carry at once: a guard against a typo, not a tuning (a run
# waiting on its model costs a few KB; benchmarks/capacity.py measures thousands).
MAX_CONCURRENCY = 100_000

# An unexpected error's traceback shows no frame's variables: they can hold secrets (a
# key, a password in a URL, an agent's credentials).
app = typer.Typer(
    help="tether: agent runs that survive interruption.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
sandbox_app = typer.Typer(help="The demo business system.", no_args_is_help=True)
app.add_typer(approvals_app, name="approvals")
app.add_typer(audit_app, name="audit")
app.add_typer(keys_app, name="keys")
app.add_typer(runs_app, name="runs")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(schedules_app, name="schedules")
app.add_typer(threads_app, name="threads")
app.add_typer(users_app, name="users")


def main() -> None:
    """Entry point: run the CLI, turning tether's errors into a message and exit 1."""
    try:
        app()
    except DatabaseMisconfigured as exc:  # it names the database and what to change
        say_error("error", exc.code, exc.message)
        sys.exit(1)
    except DatabaseUnavailable as exc:
        say_error("error", exc.code, unreachable(exc))
        sys.exit(1)
    except TetherError as exc:
        say_error("error", exc.code, exc.message)
        sys.exit(1)


# -- carrying runs -------------------------------------------------------------------------


def _processes(value: str) -> str:
    """``--processes``, checked as it is parsed: a usage error (exit 2) names what is
    accepted, and nothing starts."""
    from tether.cli.supervisor import process_count

    try:
        process_count(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


@app.command()
def worker(
    agent: AgentOpt = DEFAULT_AGENT,
    concurrency: Annotated[
        int, typer.Option(min=1, max=MAX_CONCURRENCY, help="runs carried at once")
    ] = 8,
    exit_when_idle: Annotated[
        bool, typer.Option(help="exit once no run waits and none is in hand")
    ] = False,
    reap: Annotated[bool, typer.Option(help="run the reaper on its interval")] = True,
    public_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL", help="base URL of approval links in notices (default TETHER_PUBLIC_URL)"
        ),
    ] = None,
    processes: Annotated[
        str,
        typer.Option(
            metavar="N|auto",
            callback=_processes,
            help="worker processes, each carrying --concurrency runs on a core of its own "
            "(1 to 256, or auto: one per core); above 1, this process supervises them",
        ),
    ] = "1",
) -> None:
    """Claim runs that wait for a worker and carry them to their next stop, until stopped
    (SIGTERM or SIGINT: the runs in hand are handed back at their next step). With the demo
    agent and no TETHER_SANDBOX_URL it starts its own sandbox on the shared sandbox data
    (see the log). With --processes N above 1 it starts N such workers, restarts one that
    exits (after a backoff), passes SIGTERM or SIGINT on to them and exits once they have."""
    configure("INFO")
    from tether.cli.supervisor import process_count

    count = process_count(processes)
    if count == 1:
        from tether.cli.serving import run_worker

        run_worker(
            agent, concurrency, exit_when_idle=exit_when_idle, reap=reap, public_url=public_url
        )
        return
    from tether.cli.supervisor import supervise
    from tether.cli.wiring import check_worker_start

    check_worker_start(agent, public_url)  # once, before N processes would race to
    args = ["--agent", agent, "--concurrency", str(concurrency), "--processes", "1"]
    args += ["--reap" if reap else "--no-reap", *(["--exit-when-idle"] if exit_when_idle else [])]
    args += ["--public-url", public_url] if public_url is not None else []
    raise typer.Exit(supervise(args, count, exit_when_idle=exit_when_idle))


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to bind")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            max=64,
            help="N x --concurrency runs at once, all in this process's one event loop, so "
            "on one core (0: the API alone; for more cores: tether worker --processes N)",
        ),
    ] = 1,
    agent: AgentOpt = DEFAULT_AGENT,
    public_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="base URL of approval links in notices (default TETHER_PUBLIC_URL, "
            "else http://HOST:PORT)",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, max=MAX_CONCURRENCY, help="runs each worker carries at once")
    ] = 8,
) -> None:
    """Serve the HTTP API and the approvals pages, with a worker in the same process, all on
    one engine and one event loop: --workers N gives it N x --concurrency run slots, on one
    core (run `tether worker --processes N` beside it for more). With the demo agent and no
    TETHER_SANDBOX_URL the sandbox starts in-process (see the log). SIGTERM or SIGINT stops
    accepting requests and claiming runs; once the runs in hand are finished or handed back,
    the process exits 0."""
    configure("INFO")
    from tether.cli.serving import serve_api

    own = f"http://{_url_host(host)}:{port}"
    serve_api(agent, host, port, public_url, workers * concurrency, own_url=own)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@app.command()
def reap(agent: AgentOpt = DEFAULT_AGENT) -> None:
    """One reaper pass, then exit: take over the runs whose worker died, reconcile their
    writes and hand them back to the workers; expire suspensions past their window;
    escalate the calls undecided past their tool's escalate_after_min; re-issue lost
    notices; purge runs and audit records past their retention. It needs the runs' agent
    (--agent): reconciling asks the agent's tools what became of a write."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    report = on_engine(
        agent, lambda engine: engine.operator.reap(), serve_agent=True, interactive=False
    )
    emit(report.to_json())


# -- starting, deciding and steering runs --------------------------------------------------

app.command()(ask)  # tether.cli.threads, beside the thread commands: a run starts a thread


@app.command()
def approve(
    token: Annotated[
        str | None, typer.Argument(help="the token of the notice", show_default=False)
    ] = None,
    run: Annotated[
        str | None,
        typer.Option("--run", metavar="RUN_ID", help="instead of TOKEN: the run's pending call"),
    ] = None,
    tool_call_id: Annotated[
        str | None,
        typer.Option(
            "--call",
            "--tool-call-id",
            metavar="ID",
            help="with --run: this pending call of the turn (default: its only undecided one)",
        ),
    ] = None,
    decline: Annotated[bool, typer.Option("--decline", help="decline instead")] = False,
    reason: Annotated[
        str | None, typer.Option(metavar="TEXT", help="why (the model sees it on a decline)")
    ] = None,
    arguments: Annotated[
        str | None,
        typer.Option(metavar="JSON", help="approve with these edited arguments (a JSON object)"),
    ] = None,
    digest: Annotated[
        str | None,
        typer.Option(metavar="HEX", help="the digest of the preview approved (of the edit)"),
    ] = None,
    as_user: OwnerOpt = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Decide a pending request, named by the TOKEN of its notice or by --run RUN_ID
    (tether approvals list shows them). Prints the result as JSON; exit 0 when the decision
    took effect, 1 with the error code when refused."""
    configure("WARNING")
    from tether.cli.approvals import decide_by_run, decide_by_token, finish, json_arg
    from tether.cli.wiring import on_engine

    if (token is None) == (run is None) or (tool_call_id is not None and run is None):
        raise InvalidInput("name a TOKEN or --run RUN_ID (with --call ID), not both")
    entry: dict[str, Any] = {
        "decision": "decline" if decline else "approve",
        "reason": reason,
        "digest": digest,
    }
    if arguments is not None:
        entry["arguments"] = json_arg(arguments, "--arguments")
    if run is not None:
        by_run = run
        decide = partial(decide_by_run, run_id=by_run, tool_call_id=tool_call_id)
    else:
        assert token is not None
        decide = partial(decide_by_token, token=token)
    finish(on_engine(agent, lambda e: decide(e, entry=entry, as_user=as_user), serve_agent=True))


@app.command("continue")
def continue_(
    run_id: Annotated[str, typer.Argument(help="the halted run")],
    as_user: OwnerOpt = None,
    why: Annotated[str | None, typer.Option(help="why more budget is granted")] = None,
    limits: Annotated[
        str | None,
        typer.Option(
            "--limits",
            metavar="JSON",
            help='the grant, such as {"max_steps": 30}: the limits named replace the run\'s, '
            "each at most the cap (TETHER_MAX_LIMITS); default: the default grant",
        ),
    ] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Continue a halted run with the default grant, or with --limits; a worker carries it
    on. Limits that are not a JSON object of known limits, or over the cap, are
    invalid_input (exit 1), and the run is not changed."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    grant = limits_arg(limits)  # a malformed one opens nothing

    async def go(engine: Engine) -> dict[str, Any]:
        user = as_user or (await engine.get_run(run_id)).run.user_id
        run = await engine.continue_run(run_id, user, limits=grant, why=why or "operator continue")
        return (await engine.get_tree(run.id)).run_json(run)

    emit(on_engine(agent, go, serve_agent=True))


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="the run to cancel")],
    as_user: OwnerOpt = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Cancel a run that is not finished (exit 1 with already_finished for one that is)
    and print it as JSON."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def go(engine: Engine) -> dict[str, Any]:
        user = as_user or (await engine.get_run(run_id)).run.user_id
        run = await engine.cancel_run(run_id, user)
        return (await engine.get_tree(run.id)).run_json(run)

    emit(on_engine(agent, go))


# -- the database and its users ------------------------------------------------------------


@app.command()
def migrate(agent: AgentOpt = DEFAULT_AGENT) -> None:
    """Bring the database (TETHER_DATABASE_URL) up to this tether's schema, creating a
    SQLite file that does not exist (never a folder), and make sure the agent's published
    users exist with their keys (the demo's dana and miguel)."""
    configure("WARNING")
    from tether.cli.wiring import migrate_database

    migrate_database(agent)
    out.print("[green]migrated[/green]")


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="the user's id")],
    max_priority: MaxPriorityOpt = None,
    retention_days: RetentionDaysOpt = None,
    agent: IgnoredAgentOpt = None,
) -> None:
    """Create a user (if new) and print a new API key for it; the key is shown once. A
    removed user's name is refused until their data is erased."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    typer.echo(
        on_engine(
            NO_AGENT,
            lambda engine: engine.operator.add_user(
                name, max_priority=max_priority, retention_days=retention_days
            ),
        )
    )


# -- the demo ------------------------------------------------------------------------------


@sandbox_app.command("serve")
def sandbox_serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to bind")] = 8100,
    db: Annotated[
        str, typer.Option(metavar="PATH", help="the sandbox's database file")
    ] = "./sandbox.db",
) -> None:
    """Serve the sandbox business system the demo's tools call."""
    configure("INFO")
    named(SANDBOX_SERVE)(host=host, port=port, db_path=db)


@app.command()
def demo() -> None:
    """Tell the whole story with real runs: suspension and approval, a crash, a budget
    halt, and the stale approval refused. Exits non-zero if any scene differs."""
    raise typer.Exit(named(DEMO_STORY)())
