"""Forks with real processes (reference §12): the demo agent served by ``tether serve`` over
its sandbox CRM (``tether sandbox serve``, real HTTP), its run suspended on the send after
the draft.

- ``tether runs fork`` just after the draft and ``tether continue`` of the fork: the fork
  holds the draft's result in its copied messages and goes on to the send of that same
  quote; the sandbox's own ``drafted`` counter does not move, and the fork's ledger has no
  draft. And ``tether runs fork``'s output and refusals, with the test agent.
- ``tether runs fork --dry-run``, continued, drafts and sends nothing, as the sandbox's own
  counters show; and a worker killed at ``after_intent`` of a dry run's write leaves a call
  that the reaper skips, never reconciles, and that no process ever runs.

Forks in one process are tests/integration/test_forks.py (pytest and mypy need distinct
module names across the test folders)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import downstream
import heartbeats
import httpx
import inprocess
import processes
from demo_procs import (
    DANA,
    QUESTION,
    cli,
    demo_env,
    free_port,
    henderson,
    process,
    serving,
    stopped,
)
from waiting import poll_until, run_sync

from tether import StopKind
from tether.runs import Run
from tether.sandbox import RunningSandbox
from tether.store import CallStatus, Store

# The demo's steps: find_account, get_pricing, draft_quote, then send_quote (suspends).
DRAFT_STEP = 3


def drafts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results of the draft_quote calls in ``messages``."""
    ids = {
        c["id"]
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
        if c["function"]["name"] == "draft_quote"
    }
    return [
        json.loads(m["content"])
        for m in messages
        if m["role"] == "tool" and m["tool_call_id"] in ids
    ]


def test_a_fork_just_after_the_draft_continues_to_the_send_without_drafting_again(
    db_url: str, sandbox_server: RunningSandbox, tmp_path: Path
) -> None:
    crm = sandbox_server.url
    assert httpx.post(f"{crm}/admin/reset", timeout=10).status_code == 200
    env = demo_env(TETHER_DATABASE_URL=db_url, TETHER_SANDBOX_URL=crm)
    with serving(env, tmp_path / "serve.log") as base:
        created = httpx.post(f"{base}/v1/runs", headers=DANA, json={"question": QUESTION})
        assert created.status_code == 202, created.text
        parent_id = created.json()["id"]
        parent = poll_until(lambda: stopped(base, parent_id), timeout=60, what="the send")
        assert parent["state"] == "suspended" and parent["pending"]["tool"] == "send_quote"
        assert henderson(crm) == (1, 0)
        [drafted] = drafts(parent["messages"])

        fork = cli(env, "runs", "fork", parent_id, "--at-step", str(DRAFT_STEP))

        assert fork["state"] == "halted" and fork["halt_reason"] == "forked"
        assert fork["forked_from"] == {"run_id": parent_id, "step": DRAFT_STEP}
        assert fork["agent_version"] == parent["agent_version"] and fork["dry_run"] is False
        assert fork["budget"]["consumed"] == {
            "steps": 0,
            "spend_usd": 0,
            "tool_calls": 0,
            "elapsed_ms": 0,
        }
        assert fork["budget"]["limits"] == parent["budget"]["limits"]
        assert henderson(crm) == (1, 0)  # forking executed nothing
        copied = stopped(base, fork["id"])
        assert copied is not None and drafts(copied["messages"]) == [drafted]
        assert copied["messages"] == parent["messages"][: len(copied["messages"])]

        continued = cli(env, "continue", fork["id"])
        assert continued["state"] == "running"
        after = poll_until(lambda: stopped(base, fork["id"]), timeout=60, what="the fork")

    # The fork went on from the copied draft to the send of that same quote.
    assert after["state"] == "suspended", after
    assert after["pending"]["tool"] == "send_quote"
    assert after["pending"]["arguments"]["quote_id"] == drafted["quote_id"]
    assert after["messages"][: len(copied["messages"])] == copied["messages"]
    assert henderson(crm) == (1, 0)
    store = Store(db_url)
    try:
        assert [e.tool for e in store.ledger(fork["id"])] == ["send_quote"]
        assert [e.tool for e in store.ledger(parent_id)] == [
            "find_account",
            "get_pricing",
            "draft_quote",
            "send_quote",
        ]
        assert store.get_run(parent_id).state.value == "suspended"  # type: ignore[union-attr]
        assert [f.id for f in store.forks_of(parent_id)] == [fork["id"]]
    finally:
        store.close()


def test_tether_runs_fork_prints_the_fork_and_a_refusal_exits_1_with_its_code(
    db_url: str,
) -> None:
    env = processes.tether_env(db_url, KIT_SCRIPT="standard")
    engine = inprocess.engine(db_url, script_name="standard")
    try:
        parent = engine.sync.ask("dana", "do the thing")  # suspended at step 3
        assert parent.kind is StopKind.SUSPENDED
        first = engine.sync.fork_run(parent.run_id, "dana", at_step=1)
    finally:
        engine.close()

    done = processes.tether("runs", "fork", parent.run_id, "--at-step", "2", "--dry-run", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    fork = json.loads(done.stdout)
    assert fork["forked_from"] == {"run_id": parent.run_id, "step": 2}
    assert fork["user_id"] == "dana" and fork["dry_run"] is True  # the owner, by default

    unfinished = processes.tether("runs", "fork", parent.run_id, "--at-step", "3", env=env)
    assert unfinished.returncode == 1 and "invalid_input" in unfinished.stderr
    theirs = processes.tether(
        "runs", "fork", parent.run_id, "--at-step", "1", "--as", "miguel", env=env
    )
    assert theirs.returncode == 1 and "not_found" in theirs.stderr
    store = Store(db_url)
    try:
        assert [f.id for f in store.forks_of(parent.run_id)] == [first.id, fork["id"]]
    finally:
        store.close()


# -- dry-run forks -------------------------------------------------------------------------


def _dry_fork(url: str, run_id: str, at_step: int) -> dict[str, Any]:
    env = demo_env(TETHER_DATABASE_URL=url)
    return cli(env, "runs", "fork", run_id, "--at-step", str(at_step), "--dry-run")


def _results(messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


def test_a_dry_run_fork_of_the_demo_run_drafts_and_sends_nothing(
    db_url: str, tmp_path: Path
) -> None:
    crm_port, port = free_port(), free_port()
    crm, base = f"http://127.0.0.1:{crm_port}", f"http://127.0.0.1:{port}"
    sandbox = ["sandbox", "serve", "--port", str(crm_port), "--db", str(tmp_path / "crm.db")]
    serve = ["serve", "--port", str(port), "--workers", "1"]
    env = demo_env(TETHER_DATABASE_URL=db_url, TETHER_SANDBOX_URL=crm)
    with (
        process(sandbox, env, tmp_path / "sandbox.log", f"{crm}/admin/quotes?account_id=4471"),
        process(serve, env, tmp_path / "serve.log", f"{base}/readyz"),
    ):
        created = httpx.post(f"{base}/v1/runs", headers=DANA, json={"question": QUESTION})
        assert created.status_code == 202, created.text
        parent = created.json()["id"]
        waiting = poll_until(lambda: stopped(base, parent), timeout=60, what="the send")
        assert waiting["state"] == "suspended" and waiting["pending"]["tool"] == "send_quote"
        before = henderson(crm)
        assert before == (1, 0)
        # Through step 2 the continuation drafts (and then sends); through step 3 it sends.
        forks = [_dry_fork(db_url, parent, step) for step in (2, 3)]
        for fork in forks:
            assert fork["dry_run"] is True and fork["state"] == "halted"
            assert fork["forked_from"]["run_id"] == parent
            go = httpx.post(f"{base}/v1/runs/{fork['id']}/continue", headers=DANA, json={})
            assert go.status_code == 200, go.text
        ended = [
            poll_until(functools.partial(stopped, base, f["id"]), timeout=60, what="a fork")
            for f in forks
        ]
        assert [run["state"] for run in ended] == ["answered", "answered"]
        assert henderson(crm) == before
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
    engine = inprocess.engine(db_url, script_name="work")

    async def forked() -> Run:
        parent = (await engine.ask("dana", "go")).run_id  # a read, a write, an answer
        fork = await engine.fork_run(parent, "dana", at_step=1, dry_run=True)
        return await engine.continue_run(fork.id, "dana")

    try:
        fork = run_sync(forked())
    finally:
        engine.close()
    assert len(downstream.effects()) == 1
    env = processes.tether_env(db_url, KIT_SCRIPT="work")
    crash = {**env, "TETHER_FAILPOINTS": "after_intent:record=crash"}
    died = processes.tether("worker", "--exit-when-idle", "--no-reap", env=crash)
    assert died.returncode == 137, died.stderr[-3000:]
    store = Store(db_url)
    try:
        assert [e.status for e in store.ledger(fork.id)][-1] is CallStatus.INTENT
        poll_until(lambda: heartbeats.stale(store, fork.id, unowned=True), what="a stale heartbeat")
        reaped = processes.tether("reap", env=env)
        assert reaped.returncode == 0, reaped.stderr[-3000:]
        assert [e.status for e in store.ledger(fork.id)][-1] is CallStatus.SKIPPED
        assert "reconciled" not in [e.kind for e in store.events(fork.id)]
        finished = processes.tether("worker", "--exit-when-idle", "--no-reap", env=env)
        assert finished.returncode == 0, finished.stderr[-3000:]
        run = store.get_run(fork.id)
        assert run is not None and run.state.value == "answered" and run.dry_run
        assert _results(store.messages(fork.id))[-1] == {
            "dry_run": True,
            "would_call": {"tool": "record", "arguments": {"item": "a"}},
        }
    finally:
        store.close()
    assert len(downstream.effects()) == 1  # the parent's write only
