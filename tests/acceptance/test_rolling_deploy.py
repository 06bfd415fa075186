"""Agent versions across a deploy (reference §12), with real worker processes: two workers of
different versions on one database never carry each other's runs; a rolling deploy (the
old worker SIGTERMed at a step boundary, a new one started) leaves the old version's runs
stranded and visible, untouched by the new code, until they are migrated; a migrated run
goes on under the new version from its stored messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import downstream
import processes
import versioned
from waiting import poll_until, run_sync

from tether import Engine, Run


def _run(engine: Engine, run_id: str) -> Run:
    run = run_sync(engine.get_run(run_id)).run
    assert run is not None
    return run


def _messages(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    return [dict(m) for m in run_sync(engine.get_run(run_id)).messages]


def _worker(version: str, env: dict[str, str], log: Path, *extra: str) -> processes.Process:
    return processes.spawn_agent(
        "worker", "--no-reap", *extra, agent=f"versioned:{version}", env=env, log=log
    )


def _cli(version: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return processes.tether(*args, env=env, agent=f"versioned:{version}")


def _log(path: Path) -> str:
    return path.read_text()[-3000:] if path.exists() else ""


def test_two_workers_of_different_versions_never_carry_each_others_runs(
    db_url: str, tmp_path: Path
) -> None:
    one = versioned.engine(db_url, versioned.v1())
    two = versioned.engine(db_url, versioned.v2())
    env = processes.tether_env(db_url)
    try:
        ids = {
            "kit@v1": [run_sync(one.start_run("dana", f"v1 job {i}")).id for i in range(4)],
            "kit@v2": [run_sync(two.start_run("dana", f"v2 job {i}")).id for i in range(4)],
        }
        workers = [_worker(v, env, tmp_path / f"{v}.log", "--exit-when-idle") for v in ("v1", "v2")]
        for proc, version in zip(workers, ("v1", "v2"), strict=True):
            assert proc.wait(timeout=120) == 0, _log(tmp_path / f"{version}.log")
        for version, run_ids in ids.items():
            for run_id in run_ids:
                assert _run(one, run_id).state.value == "answered"
                # Every step of the run was carried by the code of its own version.
                assert versioned.served_by(_messages(one, run_id)) == [version, version]
    finally:
        one.close()
        two.close()


def test_a_rolling_deploy_strands_old_runs_until_they_are_migrated(
    db_url: str, tmp_path: Path
) -> None:
    downstream.set_world(
        "lookup_ms", "1500"
    )  # step 2's read keeps the runs in the old worker's hand
    old = versioned.engine(db_url, versioned.v1())
    new = versioned.engine(db_url, versioned.v2())
    env = processes.tether_env(db_url, TETHER_HEARTBEAT_TIMEOUT_S="600")
    first = _worker("v1", env, tmp_path / "old.log")
    second: processes.Process | None = None
    try:
        ids = [run_sync(old.start_run("dana", f"job {i}")).id for i in range(2)]

        working = Path(os.environ["KIT_EFFECTS_DB"] + ".working")  # a lookup has begun

        def in_hand() -> bool:
            return working.exists() and all(
                _run(old, i).owner and versioned.served_by(_messages(old, i)) == ["kit@v1"]
                for i in ids
            )

        # Each run has taken its first step and is in its slow second one (or between the
        # two): SIGTERM hands it back at the boundary after that step, before its second
        # whoami. (A run only claimed, its first step not begun, is handed back with none:
        # seen on a loaded machine when the test waited for owners alone.)
        poll_until(in_hand, what="both runs in hand after their first step, a lookup under way")
        first.send_signal(signal.SIGTERM)  # the deploy: the old worker hands its runs back
        assert first.wait(timeout=60) == 0, _log(tmp_path / "old.log")
        handed_back = {i: _messages(old, i) for i in ids}
        for run_id in ids:
            run = _run(old, run_id)
            assert run.state.value == "running" and run.owner is None
            assert versioned.served_by(handed_back[run_id]) == ["kit@v1"]

        second = _worker("v2", env, tmp_path / "new.log")
        # A run of the new version, started after the old ones: once the new worker has
        # answered it, it has passed over the old runs, which waited longer.
        canary = run_sync(new.start_run("dana", "canary")).id
        poll_until(lambda: _run(new, canary).state.value == "answered", what="canary")
        for run_id in ids:
            run = _run(new, run_id)
            assert run.state.value == "running" and run.owner is None
            assert run.agent_version == "kit@v1"
            assert _messages(new, run_id) == handed_back[run_id]  # not run by the new code

        listed = _cli("v2", env, "runs", "list", "--stranded", "--json")
        assert listed.returncode == 0, listed.stderr
        stranded = json.loads(listed.stdout)["items"]
        assert {r["id"] for r in stranded} == set(ids)
        assert {r["agent_version"] for r in stranded} == {"kit@v1"}
        assert run_sync(new.operator.count_stranded()) == 2

        for run_id in ids:
            # No --agent: the live v2 worker registered what v2 has (the default agent,
            # the demo's, is loaded and not used).
            moved = processes.tether(
                "runs", "migrate", run_id, "--to-version", "kit@v2", "--reason", "deploy 43",
                "--by", "ops", env=env, agent=None,
            )  # fmt: skip
            assert moved.returncode == 0, moved.stderr
            assert json.loads(moved.stdout)["agent_version"] == "kit@v2"

        def answered() -> bool:
            return all(_run(new, i).state.value == "answered" for i in ids)

        poll_until(answered, timeout=60, what="the migrated runs answered")
        for run_id in ids:
            messages = _messages(new, run_id)
            assert messages[: len(handed_back[run_id])] == handed_back[run_id]
            assert versioned.served_by(messages) == ["kit@v1", "kit@v2"]
            events = run_sync(new.events(run_id))
            migrated = [e.data for e in events if e.kind == "migrated"]
            assert migrated == [
                {"by": "ops", "why": "deploy 43", "from_version": "kit@v1", "to_version": "kit@v2"}
            ]
        assert run_sync(new.operator.count_stranded()) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        old.close()
        new.close()
