"""``tether users``: the operator's user management (reference §6). ``add`` lives in
``tether.cli.app``; ``list``, ``remove`` and ``rotate-key`` are here. Removing a user or
rotating its key revokes the old keys and ends the inbox sessions they opened at once. They
need no agent: the engine serves a bare one (``wiring.NO_AGENT``), and ``--agent`` is
ignored."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli.shared import IgnoredAgentOpt, emit, out
from tether.telemetry.logs import configure

users_app = typer.Typer(help="Users and their API keys.", no_args_is_help=True)


@users_app.command("list")
def users_list(agent: IgnoredAgentOpt = None) -> None:
    """Every user, with when it was created and how many keys it has (never the keys)."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    emit({"items": on_engine(NO_AGENT, lambda engine: engine.list_users())})


@users_app.command("remove")
def users_remove(
    name: Annotated[str, typer.Argument(help="the user's id")], agent: IgnoredAgentOpt = None
) -> None:
    """Delete a user and its keys and end its sessions; its runs are kept. Exit 1 with
    not_found if there is no such user."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    on_engine(NO_AGENT, lambda engine: engine.remove_user(name))
    out.print(f"removed {name}: its keys are revoked and its sessions ended", markup=False)


@users_app.command("rotate-key")
def users_rotate_key(
    name: Annotated[str, typer.Argument(help="the user's id")], agent: IgnoredAgentOpt = None
) -> None:
    """Give a user a new API key, printed once; every old key stops working at once, with
    the sessions it opened. Exit 1 with not_found if there is no such user."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    typer.echo(on_engine(NO_AGENT, lambda engine: engine.rotate_key(name)))
