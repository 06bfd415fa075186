"""Forking with real processes (reference §12): the demo agent served by ``tether serve`` over
the sandbox CRM (real HTTP), its run suspended on the send after the draft; ``tether runs
fork`` just after the draft and ``tether continue`` of the fork. The fork holds the
draft's result in its copied messages and goes on to the send of that same quote: the
sandbox's own ``drafted`` counter does not move, and the fork's ledger has no draft. And
``tether runs fork``'s output and refusals, with the test agent.

(Named apart from tests/integration/test_forks.py: pytest and mypy need distinct module
names across the test folders.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import inprocess
import processes
from demo_procs import DANA, QUESTION, cli, demo_env, henderson, serving, stopped
from waiting import poll_until

from tether import StopKind
from tether.sandbox import RunningSandbox
from tether.store import Store

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
