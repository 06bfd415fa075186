"""Start-up imports only what a command uses: ``import tether`` and the CLI's command tree
load none of the engine, and what a command does not do (serve HTTP, trace, call an MCP
server or a hosted model) is not imported by it. Each check runs in a fresh interpreter, so
nothing this test process imported can hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tether

# The libraries of what most commands do not do: the HTTP layer, tracing, MCP, the model SDKs.
UNUSED = ("fastapi", "uvicorn", "starlette", "opentelemetry", "mcp", "openai", "anthropic")
# And the engine's own, which neither the package nor the command tree needs.
ENGINE = ("sqlalchemy", "pydantic", "alembic", "httpx", "prometheus_client", "tether.engine")

PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m in {names!r} or m.split(".")[0] in {names!r})))
"""


def loaded(body: str, names: tuple[str, ...], *args: str) -> list[str]:
    """The modules of ``names`` that are imported once ``body`` has run in a new process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "OTEL_"))}
    ran = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body, names=names), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    found: list[str] = json.loads(ran.stdout.splitlines()[-1])
    return found


def test_import_tether_imports_no_engine_until_a_name_is_used() -> None:
    assert loaded("import tether", UNUSED + ENGINE) == []
    assert "tether.engine" in loaded("from tether import Engine", ("tether.engine",))


def test_the_command_tree_imports_neither_the_engine_nor_what_commands_do_not_use() -> None:
    assert loaded("import tether.cli.app", UNUSED + ENGINE) == []


def test_tether_help_imports_neither_the_engine_nor_what_commands_do_not_use() -> None:
    body = (
        "from tether.cli.app import main\n"
        "sys.argv = ['tether', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
    )
    assert loaded(body, UNUSED + ENGINE) == []


def test_a_worker_with_the_demo_agent_imports_no_http_layer_tracing_mcp_or_model_sdk() -> None:
    body = (
        "from tether.agent import load_agent\n"
        "from tether.cli.shared import DEFAULT_AGENT\n"
        "import tether.cli.serving, tether.worker\n"
        "load_agent(DEFAULT_AGENT)\n"
    )
    assert loaded(body, UNUSED) == []


RUN = """
import asyncio
from tether import Agent, Engine, ScriptedModel

async def main():
    agent = Agent(name="plain", system_prompt="p")
    model = ScriptedModel([{"content": "done"}])
    async with Engine(agent=agent, model=model, database_url=sys.argv[1], migrate=True) as e:
        assert (await e.ask("dana", "hi")).kind.value == "answered"

asyncio.run(main())
"""


def test_a_run_imports_no_opentelemetry_when_nothing_configured_tracing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    assert loaded(RUN, ("opentelemetry",), url) == []


@pytest.mark.parametrize("name", tether.__all__)
def test_every_public_name_of_tether_resolves(name: str) -> None:
    value = getattr(tether, name)
    assert value is not None
    assert name in dir(tether)


COMMAND = """
import os
os.environ["TETHER_DATABASE_URL"] = sys.argv[1]
from tether.cli.app import main
sys.argv = ["tether", *sys.argv[2:]]
try:
    main()
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
"""


@pytest.mark.parametrize("command", [("runs", "list"), ("approvals", "list")])
def test_a_command_that_reads_runs_starts_no_sandbox_and_no_http_client(
    command: tuple[str, ...], sqlite_url: str
) -> None:
    """What ``runs list`` and the operator's ``approvals list`` pay for (with the demo agent,
    the default): the store and the engine, not the demo's sandbox (FastAPI, uvicorn) nor
    an HTTP client (benchmarks/cli_start.py)."""
    assert loaded(COMMAND, (*UNUSED, "httpx"), sqlite_url, *command) == []
