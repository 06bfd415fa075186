"""``tether users``: the operator's user management (reference §6). ``add`` lives in
``tether.cli.app``; ``list``, ``set``, ``remove``, ``erase`` and ``rotate-key`` are here.
Removing a user or rotating its key revokes the old keys and ends the inbox sessions they
opened at once; erasing deletes every run, thread and schedule of theirs, and the account.
They need no agent: the engine serves a bare one (``wiring.NO_AGENT``), and ``--agent`` is
ignored."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli.shared import IgnoredAgentOpt, emit, out
from tether.telemetry.logs import configure

users_app = typer.Typer(help="Users and their API keys.", no_args_is_help=True)

# A user's settings, taken by ``users add`` and ``users set`` alike (checked by the Engine).
MaxPriorityOpt = Annotated[
    int | None,
    typer.Option(
        "--max-priority",
        help="-10 to 10: the highest priority the user may ask (default TETHER_MAX_PRIORITY)",
    ),
]
RetentionDaysOpt = Annotated[
    float | None,
    typer.Option(
        "--retention-days",
        help="days (decimals allowed, more than 0) the user's halted and finished runs are "
        "kept (default TETHER_RETENTION_DAYS)",
    ),
]


@users_app.command("list")
def users_list(agent: IgnoredAgentOpt = None) -> None:
    """Every user, with when it was created and how many keys it has (never the keys)."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    emit({"items": on_engine(NO_AGENT, lambda engine: engine.operator.list_users())})


@users_app.command("remove")
def users_remove(
    name: Annotated[str, typer.Argument(help="the user's id")], agent: IgnoredAgentOpt = None
) -> None:
    """Remove a user, in one transaction: revoke their keys, end their sessions, delete
    their schedules and cancel their queued, running and suspended runs; their halted and
    finished runs stay. The name stays taken until their data is erased. Exit 1 with
    not_found if there is no such user."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    done = on_engine(NO_AGENT, lambda engine: engine.operator.remove_user(name))
    out.print(
        f"removed {name}: {done.keys_revoked} key(s) revoked and their sessions ended, "
        f"{done.schedules_deleted} schedule(s) deleted, {len(done.runs_cancelled)} run(s) "
        "cancelled",
        markup=False,
        soft_wrap=True,
    )


@users_app.command("set")
def users_set(
    name: Annotated[str, typer.Argument(help="the user's id")],
    max_priority: MaxPriorityOpt = None,
    retention_days: RetentionDaysOpt = None,
    agent: IgnoredAgentOpt = None,
) -> None:
    """Change a user's settings (--max-priority, --retention-days). Exit 1 with
    invalid_input for a bad one or none, not_found if there is no such user."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    on_engine(
        NO_AGENT,
        lambda engine: engine.operator.set_user(
            name, max_priority=max_priority, retention_days=retention_days
        ),
    )
    given = {"max priority": max_priority, "retention days": retention_days}
    said = ", ".join(f"{what} {value}" for what, value in given.items() if value is not None)
    out.print(f"set {name}: {said}", markup=False, soft_wrap=True)


@users_app.command("erase")
def users_erase(
    name: Annotated[str, typer.Argument(help="the user's id")], agent: IgnoredAgentOpt = None
) -> None:
    """Erase a user's data: cancel their runs in flight, then delete every run, thread,
    schedule, key and session of theirs and the account (the name is free again); their
    audit records keep only seq, at, kind, outcome and a digest of the name. Prints
    {"erased": {"runs", "threads", "schedules"}}; zeros for a name with nothing stored.
    Interrupted, run it again: it finishes what is left."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    done = on_engine(NO_AGENT, lambda engine: engine.operator.erase_user(name))
    emit({"erased": done.to_json()})


@users_app.command("rotate-key")
def users_rotate_key(
    name: Annotated[str, typer.Argument(help="the user's id")], agent: IgnoredAgentOpt = None
) -> None:
    """Give a user a new API key, printed once; every old key stops working at once, with
    the sessions it opened. Exit 1 with not_found if there is no such user."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    typer.echo(on_engine(NO_AGENT, lambda engine: engine.operator.rotate_key(name)))
