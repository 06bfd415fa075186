"""A crash right after an MCP write committed on the server (reference invariants 2 and 3):
a real ``tether worker`` subprocess serving an agent whose tools come from the MCP test
server over stdio is killed at ``after_tool_commit:add_note``; ``tether reap`` in another
process reconciles the write (the server deduplicates by the ``_meta`` idempotency key, so
it is re-issued under the same key) and a worker finishes the run. The server applied
the write exactly once. And the same for a destructive write killed right after
``tether approve`` ran it: the reaper finds it by its key (the agent's ``reconcile``
override) and it is not run again."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import heartbeats
import mcp_agent
import mcp_server
import processes
import pytest
import webhooks
from waiting import poll_until

from tether import Engine, ScriptedModel
from tether.config import Settings
from tether.models.base import Message
from tether.notify import MemoryNotifier
from tether.runs import Run
from tether.store import Store, idempotency_key


def tether(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The ``tether`` CLI in a new process, serving the MCP test agent."""
    return processes.tether(*args, env=env, timeout=120, agent="mcp_agent:agent")


def start_run(db_url: str, script: str = "add") -> str:
    """A run waiting for a worker (creating it needs no tool, so no server)."""
    engine = Engine(
        agent=mcp_agent.agent(),
        model=ScriptedModel(mcp_agent.SCRIPTS[script]),
        settings=Settings(database_url=db_url),
        notifier=MemoryNotifier(),
    )
    try:
        return engine.sync.start_run("dana", script).id
    finally:
        engine.close()


def test_a_crash_after_the_mcp_write_committed_is_recovered_with_one_effect(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = tmp_path / "notes.db"
    mcp_server.seed(str(notes), {"alpha": "first note"})
    env = processes.tether_env(db_url, MCP_NOTES_DB=str(notes), MCP_SCRIPT="add")
    monkeypatch.setenv("MCP_NOTES_DB", str(notes))  # for start_run's agent in this process
    run_id = start_run(db_url)

    crashed = tether(
        "worker",
        "--exit-when-idle",
        "--no-reap",
        env={**env, "TETHER_FAILPOINTS": "after_tool_commit:add_note=crash"},
    )
    assert crashed.returncode == 137, crashed.stderr[-3000:]
    assert len(mcp_server.effects(str(notes), "add_note")) == 1  # committed on the server

    store = Store(db_url)
    try:
        orphan = store.get_run(run_id)
        assert orphan is not None and orphan.state.value == "running"
        final, messages = _recover(store, run_id, env)
    finally:
        store.close()

    assert final is not None and final.state.value == "answered"
    add_call = [m for m in messages if m.get("tool_calls")][1]["tool_calls"][0]
    key = idempotency_key(run_id, str(add_call["id"]))
    # Exactly one effect, under the call's key; the recovery re-issued it with that key.
    assert mcp_server.effects(str(notes), "add_note") == [("add_note", key)]
    keys = [k for _, k, _ in mcp_server.calls(str(notes), "add_note")]
    assert keys == [key, key]
    results = [json.loads(str(m["content"])) for m in messages if m["role"] == "tool"]
    assert results[1] == {"title": "beta", "notes": 2}
    assert [m["role"] for m in messages].count("tool") == 2


def _recover(store: Store, run_id: str, env: dict[str, str]) -> tuple[Run | None, list[Message]]:
    """Once the dead owner's heartbeat is stale: ``tether reap`` recovers the run (it
    reconciles the write) and a worker finishes it; the run and its messages then."""
    poll_until(lambda: heartbeats.stale(store, run_id), what="a stale heartbeat")
    reaped = tether("reap", env=env)
    assert reaped.returncode == 0, reaped.stderr[-3000:]
    assert run_id in json.loads(reaped.stdout)["recovered"]
    finished = tether("worker", "--exit-when-idle", "--no-reap", env=env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return store.get_run(run_id), store.messages(run_id)


def test_a_crash_after_an_approved_mcp_write_committed_is_reconciled_not_rerun(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = tmp_path / "notes.db"
    mcp_server.seed(str(notes), {"alpha": "first note"})
    monkeypatch.setenv("MCP_NOTES_DB", str(notes))
    run_id = start_run(db_url, "delete")
    store = Store(db_url)
    try:
        with webhooks.receiver() as receiver:
            env = processes.tether_env(
                db_url,
                MCP_NOTES_DB=str(notes),
                MCP_SCRIPT="delete",
                TETHER_WEBHOOK_URL=receiver.url,
            )
            suspended = tether("worker", "--exit-when-idle", "--no-reap", env=env)
            assert suspended.returncode == 0, suspended.stderr[-3000:]
            assert store.get_run(run_id).state.value == "suspended"  # type: ignore[union-attr]
            assert mcp_server.calls(str(notes), "delete_note") == []
            token = receiver.token_for(run_id)
        crash = {**env, "TETHER_FAILPOINTS": "after_tool_commit:delete_note=crash"}
        approved = tether("approve", token, env=crash)
        assert approved.returncode == 137, approved.stderr[-3000:]
        assert len(mcp_server.effects(str(notes), "delete_note")) == 1
        final, messages = _recover(store, run_id, env)
    finally:
        store.close()
    assert final is not None and final.state.value == "answered"
    delete_call = [m for m in messages if m.get("tool_calls")][1]["tool_calls"][0]
    key = idempotency_key(run_id, str(delete_call["id"]))
    # Run once, by the approval; the reaper found it by its key and did not call it again.
    assert mcp_server.calls(str(notes), "delete_note") == [("delete_note", key, {"title": "alpha"})]
    assert mcp_server.effects(str(notes), "delete_note") == [("delete_note", key)]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert results[1] == "deleted"  # what the reconcile override found (a string, as is)
