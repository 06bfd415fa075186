"""The demo agent without its CRM (``tether.demo``): what its tools do when the CRM cannot
be reached, where an in-process sandbox keeps its data, and how the CLI builds the agent.
Its tools against a real sandbox are tests/integration/test_demo_agent.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from demo_procs import ORDER, closed_url, crm_context

from tether import Settings
from tether.agent import load_agent
from tether.demo.agent import draft_quote, find_account, reconcile_draft
from tether.demo.crm import Crm
from tether.demo.lifespan import sandbox_db_for
from tether.tools.tool import OutcomeUnknown, ReconcileKind, ToolFailed


async def test_an_unreachable_crm_is_unknown_for_a_write_and_a_failure_for_a_read() -> None:
    ctx = crm_context("r:c", closed_url())
    with pytest.raises(OutcomeUnknown):
        await draft_quote.call(draft_quote.validate(ORDER), ctx)
    with pytest.raises(ToolFailed):
        await find_account.call(find_account.validate({"query": "Henderson"}), ctx)
    assert (await reconcile_draft("r:c", ctx)).kind is ReconcileKind.UNREACHABLE


@pytest.mark.parametrize(
    ("database_url", "expected"),
    [
        ("sqlite:////srv/tether/tether.db", Path("/srv/tether/sandbox.db")),
        ("sqlite:///./runs.db", Path("sandbox.db")),
        ("sqlite://", Path("sandbox.db")),
        ("postgresql://tether@db/tether", Path("sandbox.db")),
    ],
)
def test_an_in_process_sandbox_keeps_its_data_beside_a_sqlite_database(
    database_url: str, expected: Path
) -> None:
    assert sandbox_db_for(database_url) == expected


def test_the_cli_gives_the_agent_factory_its_settings_and_the_agent_names_its_users() -> None:
    demo = load_agent("tether.demo.agent:build_agent", Settings(sandbox_url="http://crm:1"))
    plain = load_agent("agents:agent", Settings(sandbox_url="http://crm:1"))

    assert demo.deps == Crm(base_url="http://crm:1")
    assert dict(demo.users) == {"dana": "tether-demo-dana", "miguel": "tether-demo-miguel"}
    assert plain.name == "kit" and dict(plain.users) == {}
