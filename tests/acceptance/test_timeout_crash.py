"""A crash while a timed-out write is being reconciled recovers without a second write
(reference §10, invariant 3), with real processes on both backends.

A worker process runs a write that takes effect downstream and then hangs; at its timeout
tether reconciles it by key, and the failpoint ``after_outcome_found`` kills the process
after the outcome was learnt and before anything of it was stored. Another process (the
reaper) reconciles again and a worker finishes the run: the write happened exactly once.
This module is also the subprocesses' agent (``--agent test_timeout_crash:agent``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import agents
import downstream
import heartbeats
import processes
import pytest
from waiting import poll_until

from tether import Agent, Engine, Reconciled, ScriptedModel, Settings, ToolContext, tool
from tether.store import CallStatus, Store

HERE = Path(__file__).resolve().parent


def _script() -> ScriptedModel:
    """One write (the tool ``HANG_TOOL`` names), then the answer."""
    tool_name = os.environ.get("HANG_TOOL", "hang_async")
    return ScriptedModel([{"tool_calls": [agents.call(tool_name, item="w")]}, {"content": "done"}])


def _find(key: str, ctx: ToolContext) -> Reconciled:
    found = downstream.effects(key)
    return Reconciled.found({"item": found[0][2], "found": True}) if found else Reconciled.absent()


@tool(effect="write", reconcile=_find, timeout_s=0.5)
async def hang_async(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write that takes effect downstream, then never answers."""
    downstream.write_effect(ctx, "hang_async", item)
    await asyncio.Event().wait()
    return {}


@tool(effect="write", reconcile=_find, timeout_s=0.5)
def hang_thread(ctx: ToolContext, item: str) -> dict[str, Any]:
    """The same as a plain function: its thread blocks for good."""
    downstream.write_effect(ctx, "hang_thread", item)
    threading.Event().wait()
    return {}


def agent() -> Agent:
    return Agent(
        name="timeout-crash",
        system_prompt="You are a test agent.",
        tools=(hang_async, hang_thread),
        default_model=_script,
    )


def _tether(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": f"{HERE.parent / 'support'}:{HERE}"}
    return processes.tether(*args, env=env, timeout=120, agent="test_timeout_crash:agent")


@pytest.mark.parametrize("tool_name", ["hang_async", "hang_thread"])
def test_a_crash_while_a_timed_out_write_is_reconciled_recovers_without_a_second_write(
    db_url: str, tool_name: str
) -> None:
    engine = Engine(agent=agent(), model=_script(), settings=Settings(database_url=db_url))
    run = engine.sync.start_run("dana", "go")
    engine.close()
    plain = processes.tether_env(db_url, HANG_TOOL=tool_name)
    crashing = {**plain, "TETHER_FAILPOINTS": f"after_outcome_found:{tool_name}=crash"}
    store = Store(db_url)
    try:
        worker = _tether("worker", "--exit-when-idle", "--no-reap", env=crashing)
        assert worker.returncode == 137, worker.stderr[-3000:]
        # It took effect once; nothing of what reconciling learnt was stored.
        assert [tool for _, tool, _ in downstream.effects()] == [tool_name]
        assert [e.status for e in store.ledger(run.id)] == [CallStatus.INTENT]
        poll_until(lambda: heartbeats.stale(store, run.id), what="a stale heartbeat")
        reap = _tether("reap", env=plain)
        assert reap.returncode == 0, reap.stderr[-3000:]
        assert json.loads(reap.stdout)["recovered"] == [run.id]
        final = _tether("worker", "--exit-when-idle", "--no-reap", env=plain)
        assert final.returncode == 0, final.stderr[-3000:]
        state = store.get_run(run.id)
        ledger = store.ledger(run.id)
        events = store.events(run.id)
        messages = store.messages(run.id)
    finally:
        store.close()
    assert state is not None and state.state.value == "answered"
    assert state.recovery_attempts == 1
    assert [tool for _, tool, _ in downstream.effects()] == [tool_name]  # exactly once, all told
    results = [json.loads(str(m["content"])) for m in messages if m["role"] == "tool"]
    assert results == [{"item": "w", "found": True}]  # what the reaper's reconcile found
    assert [e.status for e in ledger] == [CallStatus.OK]
    # Only the reaper's reconciliation was recorded: the worker died before it could be.
    assert [e.data["found"] for e in events if e.kind == "reconciled"] == ["found"]
