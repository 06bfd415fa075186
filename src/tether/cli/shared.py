"""What every ``tether`` command module shares: the ``--agent`` option and printing. Kept
free of the engine, so that building the command tree (and ``--help``) imports nothing a
command does not run; the engine comes from ``tether.cli.wiring``, imported by the
commands that use one."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from tether.errors import DatabaseUnavailable, InvalidInput

DEFAULT_AGENT = "tether.demo.agent:build_agent"


def _importable_here(spec: str) -> str:
    """Make the working folder importable for ``--agent``, as uvicorn does for its app
    argument: ``--agent shop:build_agent`` finds ``./shop.py``. (``python -m tether`` has it
    on the path already; the ``tether`` script has only its own folder.)"""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    return spec


AgentOpt = Annotated[
    str,
    typer.Option(
        "--agent",
        metavar="MODULE:ATTR",
        help="the agent, found from the working folder (default: the demo agent)",
        callback=_importable_here,
        show_default=False,
    ),
]


# ``tether users`` needs no agent; ``--agent`` is still taken there, and ignored, so that
# scripts written when it was asked for go on working.
IgnoredAgentOpt = Annotated[
    str | None, typer.Option("--agent", metavar="MODULE:ATTR", hidden=True, show_default=False)
]


def as_option(scope: str) -> Any:
    """``--as USER``, the one way to tell a command whom to act as; ``scope`` says what
    that means for the command and what it does without it."""
    return typer.Option("--as", metavar="USER", help=f"act as this user {scope}")


def hidden_alias(name: str) -> Any:
    """An old spelling of ``--as`` that keeps working, out of the help."""
    return typer.Option(name, metavar="USER", hidden=True)


def acting_as(as_user: str | None, alias: str | None) -> str | None:
    """``--as``, else its old spelling."""
    return as_user if as_user is not None else alias


OwnerOpt = Annotated[str | None, as_option("(default: the run's owner)")]

# Without a terminal (output piped or captured) Rich would lay tables out in 80 columns (or
# COLUMNS), cutting ids and questions: printed whole instead, however long the lines.
PIPED_WIDTH = 100_000


def _console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = PIPED_WIDTH
    return console


out = _console()
err = _console(stderr=True)


def limits_arg(text: str | None) -> dict[str, Any] | None:
    """The ``--limits`` of ``ask`` and ``continue``: a JSON object of limits (the engine
    checks its fields and the cap before it creates or changes anything), None when not
    given; ``invalid_input`` for anything but a JSON object."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--limits must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidInput('--limits must be a JSON object, such as {"max_steps": 40}')
    return value


def say_error(label: str, code: str, message: str) -> None:
    """Print ``LABEL CODE: MESSAGE`` on standard error, the label in red. The message is
    printed as it is: never read as Rich markup (``[...]`` in it stays), never wrapped."""
    line = Text(label, style="red")
    line.append(f" {code}: {message}")
    err.print(line, soft_wrap=True, highlight=False)


def emit(data: Any) -> None:
    """Print ``data`` as JSON on standard output."""
    out.print_json(json.dumps(data, default=str))


def named(spec: str) -> Any:
    """What ``MODULE:ATTR`` names, imported now: how the CLI reaches the demo, which it
    only names (like its default ``--agent``)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def unreachable(exc: DatabaseUnavailable) -> str:
    """The one line a command prints for a database it could not reach: where it is
    (``HOST:PORT``, never the URL's password; a SQLite file), the driver's words for why,
    and what the store said (whether anything was changed)."""
    return f"cannot reach the database at {_address()} ({_reason(exc)}): {exc.message}"


def _address() -> str:
    from urllib.parse import parse_qs, urlsplit

    from tether.config import DEFAULT_DATABASE_URL

    url = os.environ.get("TETHER_DATABASE_URL") or DEFAULT_DATABASE_URL
    if url.startswith("sqlite:///"):
        return url.removeprefix("sqlite:///").partition("?")[0] or ":memory:"
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 5432
    except ValueError:  # never echo the URL: it may hold a password
        return "TETHER_DATABASE_URL"
    if host is None:  # a Unix socket: its folder is the URL's ?host=, else libpq's default
        folder = parse_qs(parts.query).get("host", ["the default socket folder"])[0]
        return f"{folder} (port {port})"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reason(exc: BaseException) -> str:
    """The driver's words, in short: the last clause of the first line of the error under
    ``exc`` (``Connection refused``, ``connection timeout expired``, ``database is locked``)."""
    cause: BaseException = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = str(cause).strip().splitlines()
    said = lines[0].rpartition("failed: ")[2].strip() if lines else ""
    return said or type(cause).__name__
