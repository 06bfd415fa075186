"""A crash while falling back (reference §21, §7), with real processes on both backends: a
``tether worker`` subprocess whose ``TETHER_MODEL`` is a list, on the real ``openai:`` and
``anthropic:`` adapters talking to fake servers, exits hard at ``before_next_model`` (the
first model failed, the second not asked yet). Nothing of the step was stored; the reaper
takes the run over and another worker asks the list again from its first model, which has
recovered: the step is stored once, by that model.

This module is also the subprocesses' agent (``--agent test_fallback_crash:agent``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import fakellm
import processes
from provider_replies import answer
from waiting import poll_until, run_sync

from tether import Agent, Engine, MemoryNotifier, ScriptedModel
from tether.config import Settings
from tether.runs import RunState
from tether.store import Store

HERE = Path(__file__).resolve().parent
MODELS = "openai:gpt-4o-mini|anthropic:claude-haiku-4-5"


def agent() -> Agent:
    return Agent(name="fallback-crash", system_prompt="You are a test agent.")


def _tether(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return processes.tether(*args, env=env, timeout=120, agent="test_fallback_crash:agent")


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


def test_a_worker_killed_between_two_models_leaves_the_step_to_the_list_from_its_first(
    db_url: str,
) -> None:
    with (
        fakellm.running(fakellm.OPENAI_PATH) as gpt,
        fakellm.running(fakellm.ANTHROPIC_PATH) as claude,
    ):
        env = processes.tether_env(
            db_url,
            TETHER_MODEL=MODELS,
            OPENAI_BASE_URL=f"{gpt.url}/v1",
            OPENAI_API_KEY="sk-test",
            ANTHROPIC_BASE_URL=claude.url,
            ANTHROPIC_API_KEY="sk-ant-test",
            PYTHONPATH=f"{HERE.parent / 'support'}:{HERE}",  # this module is the agent
        )
        gpt.script(fakellm.Reply.failure(503, "overloaded"), answer("openai", "from gpt"))
        claude.script(answer("anthropic", "from claude"))
        store = Store(db_url)
        try:
            run_id = _start(db_url)
            crash = {**env, "TETHER_FAILPOINTS": "before_next_model=crash"}
            killed = _tether("worker", "--exit-when-idle", "--no-reap", env=crash)
            assert killed.returncode == 137, killed.stderr[-3000:]
            assert (gpt.count(), claude.count()) == (1, 0)
            crashed = store.get_run(run_id)
            assert crashed is not None and crashed.state is RunState.RUNNING and crashed.owner
            assert [m["role"] for m in store.messages(run_id)] == ["system", "user"]
            assert crashed.model_failures == 0 and crashed.budget.steps == 0

            def reaped() -> bool:
                assert _tether("reap", env=env).returncode == 0
                current = store.get_run(run_id)
                return current is not None and current.owner is None

            poll_until(reaped, timeout=30, what="the reaper took the orphan over")
            finished = _tether("worker", "--exit-when-idle", "--no-reap", env=env)
            assert finished.returncode == 0, finished.stderr[-3000:]
            run = store.get_run(run_id)
            assert run is not None and run.state is RunState.ANSWERED, run
            # Asked again from the first model, which answered; the second never was.
            assert (gpt.count(), claude.count()) == (2, 0)
            turns = [e.data for e in store.events(run_id) if e.kind == "model_turn"]
            assert [(t["model"], t["text"]) for t in turns] == [("openai:gpt-4o-mini", "from gpt")]
            assert [m["role"] for m in store.messages(run_id)] == ["system", "user", "assistant"]
            assert run.budget.steps == 1 and run.model_failures == 0
            assert [e for e in store.events(run_id) if e.kind == "model_retry"] == []
        finally:
            store.close()
