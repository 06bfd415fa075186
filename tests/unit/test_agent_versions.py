"""An agent's version (reference §12) without a store: the default is the agent's name and a
digest of its prompt and tools, ``TETHER_ACCEPT_VERSIONS`` adds versions a process serves,
and tools a lifespan adds do not change it. What runs and workers do with versions is
tests/integration/test_versions.py."""

from __future__ import annotations

import dataclasses
import re

import agents
import pytest
import versioned

from tether import Agent


def test_the_default_version_is_the_name_and_a_digest_of_prompt_and_tools() -> None:
    agent = dataclasses.replace(agents.agent(), version=None)
    assert re.fullmatch(r"kit@[0-9a-f]{12}", agent.agent_version)
    assert dataclasses.replace(agents.agent(), version=None).agent_version == agent.agent_version
    reworded = dataclasses.replace(agent, system_prompt="You are another test agent.")
    fewer_tools = dataclasses.replace(agent, tools=agent.tools[:-1])
    declared = dataclasses.replace(agent, version="2026-12-01")
    assert len({agent.agent_version, reworded.agent_version, fewer_tools.agent_version}) == 3
    assert declared.agent_version == "2026-12-01"


def test_accept_versions_from_the_environment() -> None:
    from tether.config import Settings
    from tether.errors import ConfigError

    env = {"TETHER_ACCEPT_VERSIONS": " kit@v1, kit@v0 ,,kit@v1"}
    assert Settings.from_env(env).accept_versions == ("kit@v1", "kit@v0")
    assert Settings.from_env({}).accept_versions == ()
    with pytest.raises(ConfigError):
        Settings.from_env({"TETHER_ACCEPT_VERSIONS": "x" * 129})


async def test_tools_a_lifespan_adds_do_not_change_the_version() -> None:
    """An MCP server's tools are listed when a process enters the agent's lifespan; a run
    started by a process that did not (or before they were listed) has the same version."""
    from collections.abc import AsyncIterator
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def adds_whoami(agent: Agent) -> AsyncIterator[Agent]:
        yield dataclasses.replace(agent, tools=(*agent.tools, versioned.whoami))

    declared = dataclasses.replace(agents.agent(), version=None, lifespan=adds_whoami)
    async with declared.running() as served:
        assert served.tool("whoami") is not None
        assert served.agent_version == declared.agent_version
