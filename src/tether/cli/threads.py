"""``tether ask`` and ``tether threads`` (reference §14): start a run, as a new thread or a
follow-up in one, and list, show and delete threads. Operator commands, like ``tether
continue``: they act as the thread's owner unless ``--as`` names another user (a new
thread has no owner yet, so ``ask`` without ``--thread`` needs ``--as``). Like the rest of
the CLI they use nothing but the ``Engine``, imported by each command when it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from tether.cli.shared import DEFAULT_AGENT, AgentOpt, as_option, emit, limits_arg, out, say_error
from tether.errors import DatabaseUnavailable, InvalidInput, TetherError
from tether.telemetry.logs import configure

if TYPE_CHECKING:
    from tether.engine import Engine

threads_app = typer.Typer(help="List, show and delete conversations.", no_args_is_help=True)

ThreadOwnerOpt = Annotated[str | None, as_option("(default: the thread's owner)")]


def _refused(exc: TetherError) -> NoReturn:
    """Say why on standard error (with the run a busy thread waits on), print the error
    body on standard output, exit 1. A database that cannot be reached is not a refusal:
    ``main`` says where it is."""
    if isinstance(exc, DatabaseUnavailable):
        raise exc
    waits_on = exc.details.get("run_id")
    said = f"{exc.message} (it waits on run {waits_on})" if waits_on else exc.message
    say_error("error", exc.code, said)
    emit(exc.to_dict())
    raise typer.Exit(1)


def ask(
    question: Annotated[str, typer.Argument(help="what to ask")],
    thread: Annotated[
        str | None,
        typer.Option(
            "--thread", metavar="ID", help="a follow-up in this thread (default: a new one)"
        ),
    ] = None,
    as_user: Annotated[
        str | None,
        as_option("(whose run it is; default: the thread's owner; a new thread needs it)"),
    ] = None,
    if_busy: Annotated[
        str,
        typer.Option("--if-busy", metavar="reject|enqueue", help="what a busy thread does with it"),
    ] = "reject",
    priority: Annotated[
        int | None,
        typer.Option("--priority", metavar="N", help="-10 to 10, higher claimed first (0)"),
    ] = None,
    start_at: Annotated[
        str | None,
        typer.Option(
            "--start-at", metavar="TIME", help="ISO-8601 with a UTC offset: queued until then"
        ),
    ] = None,
    limits: Annotated[
        str | None,
        typer.Option(
            "--limits",
            metavar="JSON",
            help='the run\'s limits, such as {"max_steps": 40, "max_spend_usd": 2}; each at '
            "most the cap (TETHER_MAX_LIMITS), the others the defaults",
        ),
    ] = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Start a run asking QUESTION, in a new thread or (--thread) as a follow-up, and
    print its {"id", "state", "thread_id"}; a worker carries it, by --priority and not
    before --start-at, within --limits. Exit 1 with the code when refused (thread_busy
    names the run the thread waits on; limits that are not a JSON object of known limits,
    or over the cap, are invalid_input), and nothing is created."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def go(engine: Engine) -> dict[str, Any]:
        user = as_user
        if user is None:
            if thread is None:
                raise InvalidInput("a new thread has no owner yet: name whose run it is with --as")
            user = (await engine.get_thread(thread)).user_id
        run = await engine.start_run(
            user,
            question,
            limits=asked,
            thread_id=thread,
            if_busy=if_busy,
            priority=priority,
            start_at=start_at,
        )
        return {"id": run.id, "state": run.state.value, "thread_id": run.thread_id}

    try:
        asked = limits_arg(limits)  # a malformed one opens nothing
        started = on_engine(agent, go, serve_agent=True)
    except TetherError as exc:
        _refused(exc)
    emit(started)


@threads_app.command("list")
def threads_list(
    as_user: Annotated[str | None, as_option("(only their threads; default: every user's)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help='print {"items": [thread, ...]}')] = False,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Threads, most recently active first, with their runs' count, the latest run's state
    and the first question (--json: with their runs and times)."""
    configure("WARNING")
    from rich.table import Column, Table

    from tether.cli.wiring import on_engine

    found = on_engine(agent, lambda engine: engine.list_threads(as_user, limit))
    if as_json:
        emit({"items": [thread.to_json() for thread in found]})
        return
    if not found:
        out.print("No threads.")
        return
    # Whole cells, the ids above all (they are typed back); only the question gives way,
    # cut to what the terminal has left.
    rows = [
        (
            thread.id,
            thread.user_id,
            str(len(thread.runs)),
            thread.runs[-1].state.value,
            thread.runs[0].question.replace("\n", " "),
        )
        for thread in found
    ]
    names = ("id", "user", "runs", "latest", "first question")
    widths = [max(len(name), *(len(row[i]) for row in rows)) for i, name in enumerate(names)]
    room = max(14, out.width - sum(widths[:-1]) - 3 * len(names) - 1)
    widths[-1] = min(widths[-1], room)
    table = Table(
        *(Column(n, no_wrap=True, min_width=w) for n, w in zip(names, widths, strict=True))
    )
    for *cells, question in rows:
        table.add_row(*cells, question if len(question) <= room else question[: room - 1] + "…")
    out.print(table)


@threads_app.command("show")
def threads_show(
    thread_id: Annotated[str, typer.Argument(help="the thread")],
    as_user: ThreadOwnerOpt = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Print a thread as JSON: its runs in order (state and question), what they consumed
    together, and the whole conversation."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    view = on_engine(agent, lambda engine: engine.get_thread(thread_id, user=as_user))
    emit(view.to_json())


@threads_app.command("delete")
def threads_delete(
    thread_id: Annotated[str, typer.Argument(help="the thread")],
    as_user: ThreadOwnerOpt = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Delete a thread and everything of its runs. Exit 1 with thread_busy (nothing
    deleted) while a run of it is running, suspended or queued."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def go(engine: Engine) -> int:
        view = await engine.get_thread(thread_id, user=as_user)
        await engine.delete_thread(thread_id, user=view.user_id)
        return len(view.runs)

    try:
        gone = on_engine(agent, go)
    except TetherError as exc:
        _refused(exc)
    out.print(f"deleted thread {thread_id} and its {gone} run(s)", markup=False, highlight=False)
