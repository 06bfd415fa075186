"""``tether runs``: reading runs and their trees of sub-agents (reference §18), watching
them, and (reference §12) forking and migrating them. Like the rest of the CLI it uses
nothing but the ``Engine``, imported by each command when it runs
(``tether.cli.wiring``)."""

from __future__ import annotations

import getpass
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tether.cli.shared import (
    DEFAULT_AGENT,
    AgentOpt,
    OwnerOpt,
    acting_as,
    as_option,
    emit,
    hidden_alias,
    out,
)
from tether.errors import InvalidInput
from tether.telemetry.logs import configure

if TYPE_CHECKING:
    from tether.engine import Engine
    from tether.runs import Run

runs_app = typer.Typer(
    help="Read, watch, fork and migrate runs, and show their trees.", no_args_is_help=True
)


@runs_app.command("list")
def runs_list(
    as_user: Annotated[str | None, as_option("(only their runs; default: every user's)")] = None,
    user: Annotated[str | None, hidden_alias("--user")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many")] = 50,
    stranded: Annotated[
        bool,
        typer.Option(
            "--stranded", help="only runs waiting on an agent version no live worker serves"
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help='print {"items": [run, ...]}')] = False,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """List runs, newest first, as a table (--json: as JSON); with --stranded, the runs no
    live worker can carry (their agent version is served by none), longest waiting first."""
    configure("WARNING")
    from rich.table import Column, Table

    from tether.cli.wiring import on_engine
    from tether.runs import iso, run_to_json

    user = acting_as(as_user, user)
    if stranded:
        if user is not None:
            raise InvalidInput("--stranded lists every user's runs; leave out --as")
        found: Sequence[Run] = on_engine(agent, lambda engine: engine.operator.stranded_runs(limit))
    else:
        found = list(on_engine(agent, lambda engine: engine.list_runs(user, limit=limit)))
    if as_json:
        emit({"items": [run_to_json(run) for run in found]})
        return
    # Whole ids, however narrow the terminal: an id cut short is one ``runs show`` cannot
    # find. The other columns give way.
    widest = max((len(run.id) for run in found), default=2)
    table = Table(Column("id", no_wrap=True, min_width=widest), "user", "state", "step")
    for name in ("reason", "version", "updated"):
        table.add_column(name)
    for run in found:
        table.add_row(
            run.id,
            run.user_id,
            run.state.value,
            str(run.step),
            run.halt_reason or run.fail_reason or "",
            run.agent_version,
            iso(run.updated_at) or "",
        )
    out.print(table)


@runs_app.command("migrate")
def runs_migrate(
    run_id: Annotated[str, typer.Argument(help="the waiting or halted run")],
    to_version: Annotated[
        str,
        typer.Option(
            "--to-version", metavar="VERSION", help="the agent version to move the run to"
        ),
    ],
    reason: Annotated[str | None, typer.Option(metavar="TEXT", help="why the run is moved")] = None,
    as_user: Annotated[
        str | None,
        as_option("(recorded as who moved it; default: the operating-system user)"),
    ] = None,
    by: Annotated[str | None, hidden_alias("--by")] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Move a waiting or halted run to another agent version, one a live worker serves:
    the run's pending tool is checked against the tools that version's live workers
    registered, so the --agent given does not matter. Recorded as a migrated event; prints
    the run as JSON."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    who = acting_as(as_user, by) or getpass.getuser()

    async def go(engine: Engine) -> dict[str, Any]:
        run = await engine.operator.move_run(run_id, to_version, user=who, why=reason)
        return (await engine.get_tree(run.id)).run_json(run)

    emit(on_engine(agent, go))


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="the run")], agent: AgentOpt = DEFAULT_AGENT
) -> None:
    """Print a run as JSON, with its budget, the calls it waits on, its children (a
    sub-agent's runs) and its messages."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    emit(on_engine(agent, lambda engine: engine.get_run(run_id)).to_json())


@runs_app.command("tree")
def runs_tree(
    run_id: Annotated[str, typer.Argument(help="any run of the tree")],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the tree as GET /v1/runs/{id}/tree gives it")
    ] = False,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Print the tree of sub-agents a run belongs to, one line per run indented by its
    depth, parents before children: its whole id, agent, state and, when halted, the halt
    reason (and the run whose limits halted it, when another's)."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    tree = on_engine(agent, lambda engine: engine.get_tree(run_id))
    if as_json:
        emit(tree.to_json())
        return
    for run in tree.runs:
        print(tree_line(run), flush=True)


def tree_line(run: Run) -> str:
    """One run of ``tether runs tree``: indented two spaces a level."""
    parts = [run.id, str(run.route.get("agent") or "?"), run.state.value]
    if run.halt_reason is not None:
        parts.append(run.halt_reason)
        if run.halted_by is not None and run.halted_by != run.id:
            parts.append(f"(halted by {run.halted_by})")
    return "  " * run.depth + "  ".join(parts)


@runs_app.command("watch")
def runs_watch(
    run_id: Annotated[str, typer.Argument(help="the run")],
    after: Annotated[
        int, typer.Option(min=0, metavar="SEQ", help="start after this event's SEQ")
    ] = 0,
    deltas: Annotated[
        bool, typer.Option("--deltas", help="also the model's text as it is written")
    ] = False,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Print a run's events as they are stored, one JSON line each, until the run ends
    (answered, failed or cancelled); Ctrl-C stops watching a run that waits. With
    --deltas, the text of the step being generated comes between them as it is written,
    one line per piece: {"kind": "delta", "step", "offset", "text"}."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def go(engine: Engine) -> None:
        async for item in engine.watch(run_id, after=after, deltas=deltas):
            line = item.to_json() if item.kind != "delta" else {"kind": "delta", **item.to_json()}
            print(json.dumps(line, default=str), flush=True)

    on_engine(agent, go)


@runs_app.command("fork")
def runs_fork(
    run_id: Annotated[str, typer.Argument(help="the run to fork")],
    at_step: Annotated[
        int, typer.Option("--at-step", metavar="K", help="fork through this step (from 1)")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="the fork never executes a write")
    ] = False,
    as_user: OwnerOpt = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Fork a run that is not running through step K into a new halted run and print it
    as JSON; tether continue the new run to carry it on."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def go(engine: Engine) -> dict[str, Any]:
        user = as_user or (await engine.get_run(run_id)).run.user_id
        fork = await engine.fork_run(run_id, user, at_step=at_step, dry_run=dry_run)
        return (await engine.get_tree(fork.id)).run_json(fork)

    emit(on_engine(agent, go))
