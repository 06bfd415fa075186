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

from tether.errors import InvalidInput

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
        help="MODULE:ATTR of the agent, found from the working folder (default: the demo agent)",
        callback=_importable_here,
    ),
]
out = Console()
err = Console(stderr=True)


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
