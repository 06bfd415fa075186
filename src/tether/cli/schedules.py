"""``tether schedules`` (reference §13): add, list and delete cron schedules. Operator
commands: ``add`` needs ``--as`` (a schedule runs as the user it belongs to); ``list``
shows every user's schedules unless ``--as`` names one; ``delete`` acts as the
schedule's owner unless ``--as`` names another. They use nothing but the ``Engine``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tether.cli.shared import DEFAULT_AGENT, AgentOpt, as_option, emit, out
from tether.telemetry.logs import configure

if TYPE_CHECKING:
    from tether.engine import Engine

schedules_app = typer.Typer(help="Add, list and delete cron schedules.", no_args_is_help=True)


@schedules_app.command("add")
def schedules_add(
    cron: Annotated[str, typer.Argument(help="five cron fields, or @hourly/@daily/...")],
    question: Annotated[str, typer.Argument(help="what each tick asks")],
    as_user: Annotated[str, as_option("(the schedule and its runs are theirs; required)")],
    timezone: Annotated[
        str,
        typer.Option("--timezone", metavar="TZ", help="an IANA timezone, such as Europe/Paris"),
    ] = "UTC",
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Add a schedule: each tick of CRON (in --timezone) starts one run of the user asking
    QUESTION, however many workers run. Prints {"id", "next_at"}; exit 1 with invalid_input
    for a bad expression or timezone."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    added = on_engine(
        agent, lambda e: e.add_schedule(as_user, cron, question, timezone_name=timezone)
    )
    emit({"id": added.id, "next_at": added.to_json()["next_at"]})


@schedules_app.command("list")
def schedules_list(
    as_user: Annotated[
        str | None, as_option("(only their schedules; default: every user's)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='print {"items": [schedule, ...]}')
    ] = False,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Schedules, oldest first: id, user, cron and timezone, next tick, ticks fired and
    missed (--json: each as GET /v1/schedules shows it)."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    found = [s.to_json() for s in on_engine(agent, lambda e: e.list_schedules(as_user))]
    if as_json:
        emit({"items": found})
        return
    if not found:
        out.print("No schedules.")
        return
    # One line each, never cut: the ids are typed back.
    for s in found:
        line = f"{s['id']}  {s['user_id']}  {s['cron']} ({s['timezone']})  next {s['next_at']}"
        line += f"  fired {s['fired']}  missed {s['missed']}"
        out.print(line, markup=False, highlight=False, soft_wrap=True)


@schedules_app.command("delete")
def schedules_delete(
    schedule_id: Annotated[str, typer.Argument(help="the schedule")],
    as_user: Annotated[str | None, as_option("(default: the schedule's owner)")] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Delete a schedule; the runs it started stay. Exit 1 with not_found."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def go(engine: Engine) -> Any:
        found = await engine.get_schedule(schedule_id, user=as_user)
        await engine.delete_schedule(schedule_id, user=found.user_id)

    on_engine(agent, go)
    out.print(f"deleted schedule {schedule_id}", markup=False, highlight=False)
