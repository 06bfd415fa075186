"""``tether ask`` and ``tether continue`` with ``--limits JSON`` (reference §6), in real
``tether`` processes on both backends: the run's limits or the grant, each within the cap
(``TETHER_MAX_LIMITS``); a malformed JSON, an unknown limit or one over the cap is
``invalid_input`` with a message that names it, exit 1, and nothing is created or changed.
And a run's JSON shows its final answer (``"answer"``) in ``tether runs show`` and
``tether runs list --json``."""

from __future__ import annotations

import json
from typing import Any

import inprocess
import processes
from waiting import run_sync

from tether.runs import RunState
from tether.store import Store

CAP = json.dumps({"max_steps": 10, "max_spend_usd": 5})
# Refused limits, and what the message says of each.
BAD = (
    ("{max_steps: 3}", "--limits must be a JSON object"),
    ("[3]", "--limits must be a JSON object"),
    ('{"max_stepz": 3}', "max_stepz"),
    ('{"max_steps": "3"}', "max_steps"),
    ('{"max_steps": 11}', "max_steps 11 is over 10 (TETHER_MAX_LIMITS)"),
)


def _json(text: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(text)
    return data


def test_ask_takes_the_runs_limits_within_the_cap_and_refuses_bad_ones(db_url: str) -> None:
    env = processes.tether_env(db_url, TETHER_MAX_LIMITS=CAP)
    for bad, said in BAD:
        refused = processes.tether("ask", "q", "--as", "dana", "--limits", bad, env=env)
        assert refused.returncode == 1, bad
        assert "error invalid_input:" in refused.stderr and said in refused.stderr, bad
    store = Store(db_url)
    try:
        assert store.list_runs(None, limit=10) == []  # nothing created
        asked = processes.tether(
            "ask", "q", "--as", "dana", "--limits", '{"max_steps": 3, "max_spend_usd": 2}', env=env
        )
        assert asked.returncode == 0, asked.stderr
        (run,) = store.list_runs(None, limit=10)
        assert run.id == _json(asked.stdout)["id"]
        # The limits named, and the others the defaults (lowered to the cap).
        assert run.limits.to_json() == {
            "max_steps": 3,
            "max_spend_usd": 2.0,
            "max_tool_calls": 40,
            "max_elapsed_ms": 600_000,
        }
    finally:
        store.close()


def test_continue_takes_a_grant_within_the_cap_and_refuses_bad_ones(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    halted = engine.sync.ask("dana", "go", limits={"max_steps": 1})
    assert halted.reason == "max_steps"
    env = processes.tether_env(db_url, TETHER_MAX_LIMITS=CAP)
    try:
        for bad, said in BAD:
            refused = processes.tether("continue", halted.run_id, "--limits", bad, env=env)
            assert refused.returncode == 1, bad
            assert "error invalid_input:" in refused.stderr and said in refused.stderr, bad
        view = engine.sync.get_run(halted.run_id)
        assert view.run.state is RunState.HALTED and view.run.limits.max_steps == 1  # unchanged
        assert "continued" not in [e.kind for e in engine.sync.events(halted.run_id)]

        granted = processes.tether(
            "continue", halted.run_id, "--limits", '{"max_steps": 6}', "--why", "more", env=env
        )
        assert granted.returncode == 0, granted.stderr
        limits = _json(granted.stdout)["budget"]["limits"]
        # The limit named replaces the run's; the others stay as they were.
        assert (limits["max_steps"], limits["max_tool_calls"]) == (6, 40)
        (event,) = [e for e in engine.sync.events(halted.run_id) if e.kind == "continued"]
        assert event.data["why"] == "more"

        # Carried to its answer, the run's JSON shows it.
        assert run_sync(engine.run_until_stop(halted.run_id)).kind.value == "answered"
        shown = processes.tether("runs", "show", halted.run_id, env=env)
        assert shown.returncode == 0, shown.stderr
        assert _json(shown.stdout)["answer"] == "done"
        listed = processes.tether("runs", "list", "--json", env=env)
        assert [r["answer"] for r in _json(listed.stdout)["items"]] == ["done"]
    finally:
        engine.close()
