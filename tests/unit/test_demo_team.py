"""The demo's team (``tether.demo.team``), a lead that hands the quote to a quoter
sub-agent: the CLI loads it, its version covers the quoter's, its lifespan's rewiring keeps
every version of the tree, and its scripted model plays each agent's own script. The tree
carried end to end against the sandbox is the README's walkthrough."""

from __future__ import annotations

from dataclasses import replace

from tether import Settings
from tether.agent import Agent, load_agent
from tether.demo.crm import Crm
from tether.demo.team import LEAD_PROMPT, QUOTER_PROMPT, team_model, with_team_crm
from tether.messages import tool_calls_of
from tether.tools.subagent import SubAgentTool

SETTINGS = Settings(sandbox_url="http://crm:1")


def team() -> Agent:
    return load_agent("tether.demo.team:agent", SETTINGS)


def quoter_tool(lead: Agent) -> SubAgentTool:
    (tool,) = lead.subagents
    return tool


def test_the_cli_loads_the_team_a_lead_whose_one_tool_is_the_quoter() -> None:
    lead = team()
    quoter = quoter_tool(lead)

    assert lead.name == "sales-lead" and [t.name for t in lead.tools] == ["quoter"]
    assert quoter.agent.name == "quoter"
    assert [t.name for t in quoter.agent.tools] == [
        "find_account",
        "get_pricing",
        "draft_quote",
        "send_quote",
    ]
    send = quoter.agent.tool("send_quote")
    assert send is not None and send.needs_confirmation is True
    assert quoter.agent.deps == Crm(base_url="http://crm:1") == lead.deps
    assert dict(lead.users) == {"dana": "tether-demo-dana", "miguel": "tether-demo-miguel"}


def test_the_leads_version_covers_the_quoters() -> None:
    lead = team()
    quoter = quoter_tool(lead).agent
    changed = replace(quoter, system_prompt=QUOTER_PROMPT + " Be brief.")
    other = replace(lead, tools=(changed.as_tool(),))

    assert list(lead.tree) == [lead.agent_version, quoter.agent_version]
    assert lead.agent_of(quoter.agent_version) is quoter
    assert other.agent_version != lead.agent_version
    assert other.agent_version.startswith("sales-lead@")


def test_pointing_the_team_at_another_crm_keeps_every_version_of_the_tree() -> None:
    # The lifespan rewires the tree onto the sandbox it starts: a worker must still serve
    # the versions its runs were created with.
    lead = team()
    moved = with_team_crm(lead, Crm(base_url="http://elsewhere:2"))

    assert list(moved.tree) == list(lead.tree)
    assert quoter_tool(moved).agent.deps == Crm(base_url="http://elsewhere:2")


async def test_the_scripted_model_plays_the_leads_and_the_quoters_script_by_system_message() -> (
    None
):
    lead = team()
    quoter = quoter_tool(lead).agent
    model = team_model()

    async def called(system: str, agent: Agent) -> list[str]:
        asked = [{"role": "system", "content": system}, {"role": "user", "content": "q"}]
        response = await model.request(asked, list(agent.tool_specs))
        names = [call.name for call in tool_calls_of(response.message)]
        assert all(agent.tool(name) is not None for name in names)
        return names

    assert lead.instructions == LEAD_PROMPT and quoter.instructions == QUOTER_PROMPT
    assert await called(LEAD_PROMPT, lead) == ["quoter"]
    assert await called(QUOTER_PROMPT, quoter) == ["find_account"]
