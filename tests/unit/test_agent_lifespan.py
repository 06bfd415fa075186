"""``Agent.running(brief=...)``: a lifespan that takes the keyword ``brief`` learns whether
the process runs one command and exits; one written without it is entered as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tether import Agent


async def test_a_lifespan_that_takes_brief_is_told_and_one_that_does_not_is_entered() -> None:
    told: list[bool] = []

    @asynccontextmanager
    async def asks(agent: Agent, *, brief: bool = False) -> AsyncIterator[Agent]:
        told.append(brief)
        yield agent

    @asynccontextmanager
    async def plain(agent: Agent) -> AsyncIterator[Agent]:
        told.append(False)
        yield agent

    for lifespan in (asks, plain):
        agent = Agent(name="a", system_prompt="p", lifespan=lifespan)
        async with agent.running(brief=True) as served:
            assert served.name == "a"
    async with Agent(name="a", system_prompt="p", lifespan=asks).running() as served:
        assert served.name == "a"
    assert told == [True, False, False]
