"""A crash right after a compaction was stored (reference §14, §7), with real processes on
both backends: a ``tether worker`` subprocess on the real OpenAI adapter, talking to a fake
OpenAI server that records every request, exits hard at ``after_compaction``; the reaper
takes the run over and another worker finishes it. The request that worker sends next is,
byte for byte, the one a run carried without a crash sends at that point: the compacted
view, read from what is stored. The summary is not made twice.

This module is also the subprocesses' agent (``--agent test_compaction_crash:agent``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import fakellm
import processes
from waiting import poll_until, run_sync

from tether import Agent, Compaction, Engine, MemoryNotifier, ScriptedModel, tool
from tether.config import Settings
from tether.runs import RunState
from tether.store import Store

HERE = Path(__file__).resolve().parent
THRESHOLD = 1000


@tool
def lookup(query: str) -> dict[str, Any]:
    """Look something up (a read)."""
    return {"answer": f"about {query}"}


def agent() -> Agent:
    return Agent(
        name="compaction-crash",
        system_prompt="You are a test agent.",
        tools=(lookup,),
        compaction=Compaction(max_input_tokens=THRESHOLD, keep_last_turns=1),
    )


def _call(call_id: str, query: str) -> dict[str, Any]:
    arguments = json.dumps({"query": query})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }


def _script(server: fakellm.FakeLLMServer) -> None:
    """Two reads (the second reports input tokens over the threshold), the summary, the
    answer."""
    server.script(
        fakellm.Reply(
            body=fakellm.openai_completion(tool_calls=[_call("c1", "a")], prompt_tokens=50)
        ),
        fakellm.Reply(
            body=fakellm.openai_completion(tool_calls=[_call("c2", "b")], prompt_tokens=5000)
        ),
        fakellm.Reply(body=fakellm.openai_completion(content="the summary", completion_tokens=7)),
        fakellm.Reply(body=fakellm.openai_completion(content="done", prompt_tokens=60)),
    )


def _tether(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": f"{HERE.parent / 'support'}:{HERE}"}
    return processes.tether(*args, env=env, timeout=120, agent="test_compaction_crash:agent")


def _start(url: str) -> str:
    engine = Engine(
        agent=agent(),
        model=ScriptedModel([]),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )
    try:
        return run_sync(engine.start_run("dana", "q")).id
    finally:
        engine.close()


def _bytes(recorded: fakellm.Recorded) -> str:
    return json.dumps(recorded.body, sort_keys=True, separators=(",", ":"))


def test_a_worker_killed_after_a_compaction_hands_the_model_the_same_request_after_recovery(
    db_url: str, tmp_path: Path
) -> None:
    with fakellm.running(fakellm.OPENAI_PATH) as server:
        env = processes.tether_env(
            db_url,
            TETHER_MODEL="openai:gpt-4o-mini",
            OPENAI_BASE_URL=f"{server.url}/v1",
            OPENAI_API_KEY="sk-test",
        )
        store = Store(db_url)
        try:
            # Carried without a crash: what the model is sent after the compaction.
            _script(server)
            calm = _start(db_url)
            done = _tether("worker", "--exit-when-idle", "--no-reap", env=env)
            assert done.returncode == 0, done.stderr[-3000:]
            assert getattr(store.get_run(calm), "state", None) is RunState.ANSWERED
            assert server.count() == 4
            expected = _bytes(server.requests[3])
            server.reset()

            # The same run, killed right after its compaction was stored.
            _script(server)
            run_id = _start(db_url)
            crash = {**env, "TETHER_FAILPOINTS": "after_compaction=crash"}
            killed = _tether("worker", "--exit-when-idle", "--no-reap", env=crash)
            assert killed.returncode == 137, killed.stderr[-3000:]
            assert server.count() == 3  # the two turns and the summary; no call after it
            crashed = store.get_run(run_id)
            assert crashed is not None and crashed.state is RunState.RUNNING and crashed.owner
            assert [
                e.data["through_seq"] for e in store.events(run_id) if e.kind == "compacted"
            ] == [4]
            stored = store.messages(run_id)

            def reaped() -> bool:
                assert _tether("reap", env=env).returncode == 0
                current = store.get_run(run_id)
                return current is not None and current.owner is None

            poll_until(reaped, timeout=30, what="the reaper took the orphan over")
            finished = _tether("worker", "--exit-when-idle", "--no-reap", env=env)
            assert finished.returncode == 0, finished.stderr[-3000:]
            run = store.get_run(run_id)
            assert run is not None and run.state is RunState.ANSWERED, run
            # One request more, and it is the one the run without a crash sent.
            assert server.count() == 4
            assert _bytes(server.requests[3]) == expected
            sent = server.requests[3].body["messages"]
            assert sent[0]["role"] == "system"
            assert sent[1] == {"role": "user", "content": "the summary"}
            assert [m["role"] for m in sent[2:]] == ["assistant", "tool"]
            assert sent[2]["tool_calls"][0]["id"] == "c2"
            # Summarised once; the stored messages only grew; the spend of the summary
            # is counted once and no step for it.
            assert len([e for e in store.events(run_id) if e.kind == "compacted"]) == 1
            assert store.messages(run_id)[: len(stored)] == stored
            calm_run = store.get_run(calm)
            assert calm_run is not None
            assert run.budget.steps == calm_run.budget.steps == 3
            assert run.budget.spend_usd == calm_run.budget.spend_usd
        finally:
            store.close()
