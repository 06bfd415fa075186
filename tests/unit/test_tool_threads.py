"""A plain-function tool runs in a thread: while it works, the event loop (other runs, the
run's own heartbeat) goes on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from waiting import until

from tether import Agent, Engine, ScriptedModel, Settings, StopKind, tool


async def test_a_plain_function_tool_does_not_block_the_event_loop(tmp_path: Path) -> None:
    started = threading.Event()
    release = threading.Event()

    @tool
    def slow(query: str) -> dict[str, bool]:
        """A blocking read that waits until the event loop answers it."""
        started.set()
        return {"released": release.wait(timeout=20)}

    async def answer_from_the_loop() -> None:
        # If the tool held the event loop, this could only run after the tool gave up.
        await until(started.is_set, timeout=20, what="the tool to start")
        release.set()

    model = ScriptedModel(
        [{"tool_calls": [{"name": "slow", "arguments": {"query": "q"}}]}, {"content": "done"}]
    )
    agent = Agent(name="threads", system_prompt="s", tools=(slow,))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 't.db'}")
    async with Engine(agent=agent, model=model, settings=settings, migrate=True) as engine:
        outcome, _ = await asyncio.gather(engine.ask("dana", "go"), answer_from_the_loop())
        view = await engine.get_run(outcome.run_id)
    assert outcome.kind is StopKind.ANSWERED
    results = [m["content"] for m in view.messages if m["role"] == "tool"]
    assert results == ['{"released":true}']
