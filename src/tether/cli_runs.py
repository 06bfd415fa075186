"""``tether runs``: reading runs, watching them, and (SPEC §12) forking and migrating
them. Like the rest of the CLI it uses nothing but the ``Engine``."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from tether.cli_engine import DEFAULT_AGENT, AgentOpt, emit, on_engine, out
from tether.engine import Engine
from tether.logs import configure
from tether.runs import iso, run_to_json

runs_app = typer.Typer(help="Read, watch, fork and migrate runs.", no_args_is_help=True)


@runs_app.command("list")
def runs_list(
    user: Annotated[str | None, typer.Option(help="only this user's runs")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """List runs, newest first."""
    configure("WARNING")
    found = on_engine(agent, lambda engine: engine.list_runs(user, limit))
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
    view = on_engine(agent, lambda engine: engine.get_run(run_id))
    emit({**run_to_json(view.run), "messages": view.messages})


@runs_app.command("watch")
def runs_watch(
    run_id: str,
    after: Annotated[int, typer.Option(min=0, help="start after this event's SEQ")] = 0,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Print a run's events as they are stored, one JSON line each, until the run ends
    (answered, failed or cancelled); Ctrl-C stops watching a run that waits."""
    configure("WARNING")

    async def go(engine: Engine) -> None:
        async for event in engine.watch(run_id, after=after):
            print(json.dumps(event.to_json(), default=str), flush=True)

    on_engine(agent, go)
