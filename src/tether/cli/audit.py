"""``tether audit export`` (reference §19): every audit record as JSON lines, for an
operator. It needs no agent (the engine serves a bare one, ``wiring.NO_AGENT``), reads the
audit a page at a time in ``seq`` order and changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from tether.cli.shared import IgnoredAgentOpt
from tether.errors import InvalidInput
from tether.telemetry.logs import configure

if TYPE_CHECKING:
    from tether.engine import Engine

audit_app = typer.Typer(help="The audit of decisions.", no_args_is_help=True)

PAGE = 1000  # records read at a time: the export's memory stays one page's


def since_arg(text: str | None) -> float | None:
    """``--since``: an ISO-8601 time (one without a UTC offset is UTC) as epoch seconds,
    None when not given; ``invalid_input`` for anything else."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text) if len(text) <= 64 else None
        if when is not None:
            return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):
        pass
    raise InvalidInput(
        "--since must be an ISO-8601 time, such as 2026-12-01T09:00:00+01:00 or "
        "2026-12-01 (without an offset: UTC)"
    )


@audit_app.command("export")
def audit_export(
    since: Annotated[
        str | None,
        typer.Option(metavar="ISO", help="only the records at or after this time (no offset: UTC)"),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option("--user", metavar="USER", help="only the records of USER's runs"),
    ] = None,
    agent: IgnoredAgentOpt = None,
) -> None:
    """Write every audit record (decisions, recorded approvals, escalations, grants,
    migrations, cancellations), oldest first, one JSON object a line, to standard output.
    Exit 1 with invalid_input for a malformed --since or --user; nothing is changed."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    start = since_arg(since)  # a malformed one opens nothing

    async def export(engine: Engine) -> None:
        after = 0
        while True:
            page = await engine.operator.audit_records(
                after=after, limit=PAGE, since=start, user=user
            )
            for record in page:
                print(json.dumps(record.to_json()))
            if page.after is None:
                return
            after = page.after

    on_engine(NO_AGENT, export)
