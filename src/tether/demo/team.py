"""The demo as a tree of sub-agents (reference §18): a sales lead that hands the quote to a
quoter, a sub-agent with the demo agent's quoting tools, whose send a person confirms.

``tether serve --agent tether.demo.team:agent`` serves the whole tree with no model
configured: the default model is one script that plays the lead's turns for the lead's
runs and the demo's quoting turns for the quoter's (``ScriptedModel(by_system=...)``, each
run picks its script by its system message). Like the demo agent, serving it starts the
sandbox CRM in-process when no ``TETHER_SANDBOX_URL`` is set, and points every agent of
the tree at it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tether import Agent, ScriptedModel, Settings
from tether.demo.agent import DEMO_PACE, DEMO_TURNS, DEMO_USERS, scope_resolver, with_crm
from tether.demo.crm import Crm
from tether.demo.lifespan import sandbox_db_for, sandbox_lifespan
from tether.tools.subagent import SubAgentTool

LEAD_PROMPT = """\
You lead an inside-sales team's requests. You do not touch the CRM yourself: hand each \
quote, with the account, SKU and quantity, to the quoter, and tell the rep what it \
answered, plainly, including a send that was declined or refused."""

QUOTER_PROMPT = """\
You are the quoter of an inside-sales team. You are handed one quote to draft and send in \
the CRM through your tools. Use only the tools' results for names, prices and discounts; \
never invent them. Sending a quote is confirmed by a person: if a send is declined or \
refused, say so plainly and do not retry it on your own."""

# The task the lead hands the quoter (the README's walkthrough asks for this quote).
QUOTE_TASK = "Draft and send a quote for Henderson (account 4471), 200 of SKU-4411."

# The lead's script: one delegation, then its answer once the quoter's result is back.
LEAD_TURNS = (
    {
        "content": "I am handing the Henderson quote to the quoter.",
        "tool_calls": [{"name": "quoter", "arguments": {"task": QUOTE_TASK}}],
    },
    {
        "content": "The quoter has finished the Henderson quote (200 x SKU-4411); its "
        "answer above says how the draft and the send went."
    },
)
# The quoter's script: the demo's quoting turns, then an answer for the lead (not the rep).
QUOTER_TURNS = (
    *DEMO_TURNS[:-1],
    {
        "content": "I drafted the quote for Henderson (200 x SKU-4411) and a person was "
        "asked to confirm its send; the send's result above says whether it went out."
    },
)
LEAD_FINAL = "I have nothing more to hand the quoter."
QUOTER_FINAL = "I have nothing more to quote."


def team_model() -> ScriptedModel:
    """The scripted model of the whole tree: the lead's turns, and the demo's quoting turns
    for the runs whose system message is the quoter's."""
    return ScriptedModel(
        LEAD_TURNS,
        final=LEAD_FINAL,
        stream=DEMO_PACE,
        by_system={QUOTER_PROMPT: {"turns": list(QUOTER_TURNS), "final": QUOTER_FINAL}},
    )


def quoter(crm: Crm) -> SubAgentTool:
    """The quoter as the lead's tool: a sub-agent with the demo's four quoting tools (the
    send confirmed by a person) and the CRM's scopes, bounded apart from the tree."""
    agent = with_crm(Agent(name="quoter", system_prompt=QUOTER_PROMPT), crm)
    return agent.as_tool(
        description="Hand the quoter one quote to draft and send: the account, the SKU and "
        "the quantity. It answers with how the draft and the send went.",
        limits={"max_steps": 10, "max_tool_calls": 10},
    )


def with_team_crm(lead: Agent, crm: Crm) -> Agent:
    """``lead`` and its quoter pointed at ``crm``: a sub-agent's tools use its own deps, so
    the quoter is rebuilt with the CRM, and the lead resolves scopes in it (who may decide
    the quoter's send, in the inbox and ``GET /v1/approvals``)."""
    return replace(lead, deps=crm, tools=(quoter(crm),), resolve_scope=scope_resolver(crm))


def agent(settings: Settings | None = None, *, sandbox_db: str | Path | None = None) -> Agent:
    """The demo's team (``--agent tether.demo.team:agent``): the lead and its quoter,
    calling the sandbox at ``settings.sandbox_url`` or, without one, a sandbox started
    in-process on ``sandbox_db`` (as the demo agent does)."""
    settings = settings or Settings.from_env()
    db = Path(sandbox_db) if sandbox_db is not None else sandbox_db_for(settings.database_url)
    lead = Agent(
        name="sales-lead",
        system_prompt=LEAD_PROMPT,
        default_model=team_model,
        users=DEMO_USERS,
        users_max_priority=10,
        lifespan=sandbox_lifespan(db, with_team_crm),
    )
    return with_team_crm(lead, Crm(base_url=settings.sandbox_url))
