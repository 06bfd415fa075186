"""The operator's ``tether users`` commands against real processes (reference §6, §13): a
user removed while a worker carries their run, whose next write is fenced; published keys
an operator revoked that stay revoked across ``serve`` restarts and ``migrate``; and the
priority bounds set by ``users add|set --max-priority``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import demo_procs
import downstream
import httpx
import inprocess
import processes
from waiting import poll_until, run_sync

from tether.runs import RunState
from tether.sandbox import RunningSandbox
from tether.store import Store


def test_removing_a_user_fences_the_worker_carrying_their_run(db_url: str) -> None:
    downstream.set_world("lookup_ms", "1500")
    engine = inprocess.engine(db_url, script_name="standard")
    run_sync(engine.operator.add_user("ana"))
    run = engine.sync.start_run("ana", "go")
    engine.close()
    store = Store(db_url)
    env = processes.tether_env(db_url, KIT_SCRIPT="standard")
    worker = processes.start("worker", "--exit-when-idle", "--no-reap", env=env)
    try:
        working = Path(os.environ["KIT_EFFECTS_DB"] + ".working")
        poll_until(working.exists, what="the run's first tool at work")
        # Paused while it carries the run (its read in hand), the user is removed.
        processes.pause_outside_a_write(worker, db_url)
        carried = store.get_run(run.id)
        assert carried is not None and carried.owner is not None
        removed = processes.tether("users", "remove", "ana", env=env)
        assert removed.returncode == 0, removed.stderr
        assert "1 run(s) cancelled" in removed.stdout
        downstream.set_world("lookup_ms", "0")
    finally:
        worker.send_signal(signal.SIGCONT)
    _, stderr = worker.communicate(timeout=120)
    assert worker.returncode == 0, stderr
    assert "lease lost" in stderr  # its next write was refused by the store
    after = store.get_run(run.id)
    assert after is not None and after.state is RunState.CANCELLED
    assert after.message_count == carried.message_count  # nothing written after removal
    events = store.events(run.id)
    assert events[-1].kind == "cancelled" and events[-1].data["reason"] == "user_removed"
    store.close()
    assert downstream.effects() == []  # the write of its next turn never happened


def test_revoked_demo_keys_stay_revoked_across_serve_restarts_and_migrate(
    db_url: str, sandbox_server: RunningSandbox, tmp_path: Path
) -> None:
    env = demo_procs.demo_env(TETHER_DATABASE_URL=db_url, TETHER_SANDBOX_URL=sandbox_server.url)
    with demo_procs.serving(env, tmp_path / "first.log") as base:
        assert _status(base, "tether-demo-dana") == _status(base, "tether-demo-miguel") == 200
        # The demo's users may ask priorities up to 10.
        asked = httpx.post(
            f"{base}/v1/runs",
            json={"question": demo_procs.QUESTION, "priority": 10},
            headers=demo_procs.DANA,
            timeout=10,
        )
        assert asked.status_code == 202, asked.text
    rotated = _tether(env, "users", "rotate-key", "dana")
    assert rotated.returncode == 0, rotated.stderr
    assert _tether(env, "users", "remove", "miguel").returncode == 0
    fresh = rotated.stdout.strip()
    for restart in ("second.log", "third.log"):
        with demo_procs.serving(env, tmp_path / restart) as base:
            assert _status(base, "tether-demo-dana") == 401
            assert _status(base, "tether-demo-miguel") == 401
            assert _status(base, fresh) == 200
        assert _tether(env, "migrate").returncode == 0
    again = _tether(env, "users", "add", "miguel")
    assert again.returncode == 1 and "tether users erase miguel" in again.stderr
    listed = json.loads(_tether(env, "users", "list").stdout)["items"]
    shown = {u["name"]: (u["keys"], u["max_priority"], u["removed_at"] is None) for u in listed}
    assert shown == {"dana": (1, 10, True), "miguel": (0, 10, False)}


def test_users_add_and_set_bound_the_priority_a_user_may_ask(db_url: str) -> None:
    env = processes.tether_env(db_url)
    added = processes.tether("users", "add", "erin", "--max-priority", "5", env=env)
    assert added.returncode == 0, added.stderr
    asked = processes.tether("ask", "q", "--as", "erin", "--priority", "5", env=env)
    assert asked.returncode == 0, asked.stderr
    above = processes.tether("ask", "q", "--as", "erin", "--priority", "6", env=env)
    assert above.returncode == 1 and "bound of 5" in above.stderr
    for refused, code in [
        (("users", "set", "erin", "--max-priority", "11"), "invalid_input"),
        (("users", "set", "erin"), "invalid_input"),
        (("users", "set", "nobody", "--max-priority", "1"), "not_found"),
        (("users", "add", "finn", "--max-priority", "-11"), "invalid_input"),
    ]:
        answer = processes.tether(*refused, env=env)
        assert answer.returncode == 1 and f"error {code}:" in answer.stderr, refused
    lowered = processes.tether("users", "set", "erin", "--max-priority", "-1", env=env)
    assert lowered.returncode == 0, lowered.stderr
    listed = json.loads(processes.tether("users", "list", env=env).stdout)["items"]
    assert [(u["name"], u["max_priority"]) for u in listed] == [("erin", -1)]  # finn: none
    asked = processes.tether("ask", "q", "--as", "erin", env=env)
    assert json.loads(asked.stdout)["state"] == "running"
    store = Store(db_url)
    try:
        assert sorted(r.priority for r in store.list_runs("erin", limit=10)) == [-1, 5]
    finally:
        store.close()


def _status(base: str, key: str) -> int:
    response = httpx.get(f"{base}/v1/runs", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return response.status_code


def _tether(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """A ``tether`` command of the demo agent (the default ``--agent``)."""
    return processes.tether(*args, env=env, agent=None)
