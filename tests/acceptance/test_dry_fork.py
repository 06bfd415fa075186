"""Dry runs with real processes (SPEC §12): the demo agent, served by ``tether serve`` over
its sandbox CRM (``tether sandbox serve``), forked with ``tether runs fork --dry-run`` and
continued, drafts and sends nothing, as the sandbox's own counters show; and a worker
killed at ``after_intent`` of a dry run's write leaves a call that the reaper skips,
never reconciles, and that no process ever runs."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import kit

from tether.runs import Run
from tether.store import CallStatus, Store

DANA = {"Authorization": "Bearer tether-demo-dana"}
QUESTION = "Draft and send a quote for Henderson, 200 of SKU-4411"
STOP_S = 30


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(extra)
    return env


def _up(proc: subprocess.Popen[bytes], url: str, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _process(args: list[str], env: dict[str, str], log: Path, ready_url: str) -> Iterator[None]:
    """A ``tether`` subprocess, once ``ready_url`` answers 200; stopped on the way out."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", *args],
            env=env,
            cwd=log.parent,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        kit.poll_until(lambda: _up(proc, ready_url, log), timeout=60, what=" ".join(args))
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_S)


def _stopped(base: str, run_id: str) -> dict[str, Any] | None:
    """The run's JSON once it is no longer running, else None."""
    response = httpx.get(f"{base}/v1/runs/{run_id}", headers=DANA, timeout=10)
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return None if run["state"] == "running" else run


def _henderson(crm: str) -> tuple[int, int]:
    counts = httpx.get(f"{crm}/admin/quotes", params={"account_id": "4471"}, timeout=10).json()
    return counts["drafted"], counts["sent"]


def _dry_fork(url: str, run_id: str, at_step: int) -> dict[str, Any]:
    fork_args = ["runs", "fork", run_id, "--at-step", str(at_step), "--dry-run"]
    done = subprocess.run(
        [sys.executable, "-m", "tether", *fork_args],
        env=_env(TETHER_DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fork: dict[str, Any] = json.loads(done.stdout)
    return fork


def _results(messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


def test_a_dry_run_fork_of_the_demo_run_drafts_and_sends_nothing(
    db_url: str, tmp_path: Path
) -> None:
    crm_port, port = _free_port(), _free_port()
    crm, base = f"http://127.0.0.1:{crm_port}", f"http://127.0.0.1:{port}"
    sandbox = ["sandbox", "serve", "--port", str(crm_port), "--db", str(tmp_path / "crm.db")]
    serve = ["serve", "--port", str(port), "--workers", "1"]
    env = _env(TETHER_DATABASE_URL=db_url, TETHER_SANDBOX_URL=crm)
    with (
        _process(sandbox, env, tmp_path / "sandbox.log", f"{crm}/admin/quotes?account_id=4471"),
        _process(serve, env, tmp_path / "serve.log", f"{base}/readyz"),
    ):
        created = httpx.post(f"{base}/v1/runs", headers=DANA, json={"question": QUESTION})
        assert created.status_code == 202, created.text
        parent = created.json()["id"]
        waiting = kit.poll_until(lambda: _stopped(base, parent), timeout=60, what="the send")
        assert waiting["state"] == "suspended" and waiting["pending"]["tool"] == "send_quote"
        before = _henderson(crm)
        assert before == (1, 0)
        # Through step 2 the continuation drafts (and then sends); through step 3 it sends.
        forks = [_dry_fork(db_url, parent, step) for step in (2, 3)]
        for fork in forks:
            assert fork["dry_run"] is True and fork["state"] == "halted"
            assert fork["forked_from"]["run_id"] == parent
            go = httpx.post(f"{base}/v1/runs/{fork['id']}/continue", headers=DANA, json={})
            assert go.status_code == 200, go.text
        ended = [
            kit.poll_until(functools.partial(_stopped, base, f["id"]), timeout=60, what="a fork")
            for f in forks
        ]
        assert [run["state"] for run in ended] == ["answered", "answered"]
        assert _henderson(crm) == before
    store = Store(db_url)
    try:
        draft_fork, send_fork = (store.ledger(f["id"]) for f in forks)
        assert [(e.tool, e.status) for e in draft_fork][-2:] == [
            ("draft_quote", CallStatus.SKIPPED),
            # The skipped draft has no quote_id for the send: the model's call is refused.
            ("send_quote", CallStatus.ERROR),
        ]
        assert [(e.tool, e.status) for e in send_fork][-1:] == [("send_quote", CallStatus.SKIPPED)]
        sent = _results(store.messages(forks[1]["id"]))[-1]
        assert sent["dry_run"] is True and sent["would_call"]["tool"] == "send_quote"
        assert store.get_run(parent).state.value == "suspended"  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_dry_write_left_at_after_intent_by_a_killed_worker_is_skipped_never_run(
    db_url: str,
) -> None:
    engine = kit.engine(db_url, script_name="work")

    async def forked() -> Run:
        parent = (await engine.ask("dana", "go")).run_id  # a read, a write, an answer
        fork = await engine.fork_run(parent, "dana", at_step=1, dry_run=True)
        return await engine.continue_run(fork.id, "dana")

    try:
        fork = asyncio.run(forked())
    finally:
        engine.close()
    assert len(kit.effects()) == 1
    env = kit.tether_env(db_url, KIT_SCRIPT="work")
    crash = {**env, "TETHER_FAILPOINTS": "after_intent:record=crash"}
    died = kit.tether("worker", "--exit-when-idle", "--no-reap", env=crash)
    assert died.returncode == 137, died.stderr[-3000:]
    store = Store(db_url)
    try:
        assert [e.status for e in store.ledger(fork.id)][-1] is CallStatus.INTENT
        kit.poll_until(lambda: _stale(store, fork.id), what="a stale heartbeat")
        reaped = kit.tether("reap", env=env)
        assert reaped.returncode == 0, reaped.stderr[-3000:]
        assert [e.status for e in store.ledger(fork.id)][-1] is CallStatus.SKIPPED
        assert "reconciled" not in [e.kind for e in store.events(fork.id)]
        finished = kit.tether("worker", "--exit-when-idle", "--no-reap", env=env)
        assert finished.returncode == 0, finished.stderr[-3000:]
        run = store.get_run(fork.id)
        assert run is not None and run.state.value == "answered" and run.dry_run
        assert _results(store.messages(fork.id))[-1] == {
            "dry_run": True,
            "would_call": {"tool": "record", "arguments": {"item": "a"}},
        }
    finally:
        store.close()
    assert len(kit.effects()) == 1  # the parent's write only


def _stale(store: Store, run_id: str) -> bool:
    run = store.get_run(run_id)
    assert run is not None
    return run.owner is None or store.now() - (run.heartbeat_at or 0) > 0.35
