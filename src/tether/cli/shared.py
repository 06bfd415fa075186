"""What every ``tether`` command module shares: the ``--agent`` option and printing. Kept
free of the engine, so that building the command tree (and ``--help``) imports nothing a
command does not run; the engine comes from ``tether.cli.wiring``, imported by the
commands that use one."""

from __future__ import annotations

import importlib
import json
from typing import Annotated, Any

import typer
from rich.console import Console

DEFAULT_AGENT = "tether.demo.agent:build_agent"
AgentOpt = Annotated[
    str, typer.Option("--agent", help="MODULE:ATTR of the agent (default: the demo agent)")
]
out = Console()
err = Console(stderr=True)


def emit(data: Any) -> None:
    """Print ``data`` as JSON on standard output."""
    out.print_json(json.dumps(data, default=str))


def named(spec: str) -> Any:
    """What ``MODULE:ATTR`` names, imported now: how the CLI reaches the demo, which it
    only names (like its default ``--agent``)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)
