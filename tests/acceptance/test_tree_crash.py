"""Crash safety of a tree of sub-agents with real processes (reference §7 and §18).

A lead hands two tasks to a helper in one turn, beside a read (``tree_agents.py``); each
helper run makes one write downstream, then answers. A ``tether worker`` process is killed
(``os._exit(137)``) at each gap a tree adds and in the middle of a child's step; other
processes (a reaper, a worker) finish the tree. Everything is counted from the store and
the downstream, never from timing: one child per call, each child's write once, each
child's result stored once and in call order, and a waiting parent never taken by a reaper.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import downstream
import heartbeats
import inprocess
import processes
import tree_agents
from tree_agents import HELPER_ANSWER, LEAD_ANSWER, NOTE, TASKS
from waiting import poll_until

from tether.messages import ToolCall, tool_calls_of
from tether.runs import Run, RunState
from tether.store import Store

AGENT = "tree_agents:agent"


def start(url: str) -> str:
    """A new run of the lead, ready for a worker; its id."""
    engine = inprocess.engine_for(url, tree_agents.agent(), tree_agents.script())
    try:
        return engine.sync.start_run("dana", "file both notes").id
    finally:
        engine.close()


def worker(url: str, *options: str, failpoints: str = "") -> int:
    """A ``tether worker`` process that carries every ready run of the tree until it is
    idle or a failpoint kills it; its exit code (137: killed)."""
    extra = {"TETHER_FAILPOINTS": failpoints} if failpoints else {}
    env = processes.tether_env(url, **extra)
    args = ("worker", "--exit-when-idle", "--no-reap", *options)
    done = processes.tether(*args, env=env, agent=AGENT, timeout=120)
    assert done.returncode in (0, 137), done.stderr[-3000:]
    return done.returncode


def reap(url: str) -> dict[str, Any]:
    """One reaper pass in a process of its own; its report."""
    done = processes.tether("reap", env=processes.tether_env(url), agent=AGENT)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def run(store: Store, run_id: str) -> Run:
    found = store.get_run(run_id)
    assert found is not None
    return found


def turn(store: Store, parent_id: str) -> list[ToolCall]:
    """The calls of the lead's first turn, in call order."""
    first = next(m for m in store.messages(parent_id) if m["role"] == "assistant")
    return tool_calls_of(first)


def helper_calls(store: Store, parent_id: str) -> list[str]:
    """The ids of the lead's sub-agent calls, in call order."""
    return [c.id for c in turn(store, parent_id) if c.name == "helper"]


def results(store: Store, run_id: str) -> list[tuple[str, Any]]:
    """The run's tool results as stored, in order: (tool call id, content)."""
    return [
        (str(m["tool_call_id"]), json.loads(str(m["content"])))
        for m in store.messages(run_id)
        if m["role"] == "tool"
    ]


def notes() -> dict[str, int]:
    """The downstream's ``file_note`` effects, counted per idempotency key."""
    counted: dict[str, int] = {}
    for key, tool_name, item in downstream.effects():
        assert (tool_name, item) == ("file_note", NOTE)
        counted[key] = counted.get(key, 0) + 1
    return counted


def wait_stale(store: Store, run_id: str) -> None:
    """Until the run's last heartbeat is older than the processes' heartbeat timeout."""
    poll_until(functools.partial(heartbeats.stale, store, run_id), what="a stale heartbeat")


def check_tree(store: Store, parent_id: str) -> list[Run]:
    """The tree finished once: the lead answered, one child per sub-agent call (and no
    other run), each child answered after one write downstream, and each child's result
    stored exactly once, in call order. The children, in call order."""
    parent = run(store, parent_id)
    assert parent.state is RunState.ANSWERED and parent.answer == LEAD_ANSWER
    calls = helper_calls(store, parent_id)
    children = store.children(parent_id)
    assert [c.parent_tool_call_id for c in children] == calls
    assert [c.question for c in children] == list(TASKS)
    assert [r.id for r in store.tree(parent_id)] == [parent_id, *(c.id for c in children)]
    started = [e.data for e in store.events(parent_id) if e.kind == "child_started"]
    assert [(e["run_id"], e["tool_call_id"]) for e in started] == [
        (c.id, c.parent_tool_call_id) for c in children
    ]
    stopped = [e.data for e in store.events(parent_id) if e.kind == "child_stopped"]
    assert sorted(e["run_id"] for e in stopped) == sorted(c.id for c in children)
    for child in children:
        assert child.state is RunState.ANSWERED and child.answer == HELPER_ANSWER
        assert [content for _, content in results(store, child.id)] == [
            {"done": "file_note", "item": NOTE}
        ]
    # Every call of the lead's turn has one result; the children's are in call order.
    stored = results(store, parent_id)
    assert sorted(i for i, _ in stored) == sorted(c.id for c in turn(store, parent_id))
    assert [(i, c) for i, c in stored if i in calls] == [
        (call_id, {"answer": HELPER_ANSWER}) for call_id in calls
    ]
    # Each child wrote once, under its own key (``RUN_ID:TOOL_CALL_ID``).
    written = notes()
    assert sorted(written.values()) == [1, 1], written
    assert sorted(key.partition(":")[0] for key in written) == sorted(c.id for c in children)
    return children


def test_killed_after_its_children_started_the_parent_waits_and_no_reaper_takes_it(
    db_url: str,
) -> None:
    """``after_children_started``: the lead's turn, its children and its ``waiting`` state
    are durable and the worker dies. The lead is not an orphan: a reaper pass, once its
    last heartbeat is stale, leaves it alone; another worker runs each child once, and the
    last child's stop makes the lead ready again."""
    parent_id = start(db_url)
    code = worker(db_url, "--concurrency", "1", failpoints="after_children_started=crash")
    assert code == 137
    store = Store(db_url)
    try:
        parent = run(store, parent_id)
        assert parent.state is RunState.WAITING and parent.owner is None
        children = store.children(parent_id)
        assert [c.question for c in children] == list(TASKS)
        assert all(c.state is RunState.RUNNING and c.owner is None for c in children)
        # The read beside the sub-agent calls was stored before the children started.
        assert [i for i, _ in results(store, parent_id)] == [
            c.id for c in turn(store, parent_id) if c.name == "lookup"
        ]
        assert notes() == {}
        wait_stale(store, parent_id)
        assert reap(db_url)["recovered"] == []
        after = run(store, parent_id)
        assert after.state is RunState.WAITING and after.owner is None
        assert (after.lease_epoch, after.recovery_attempts) == (parent.lease_epoch, 0)
        assert [(c.owner, c.lease_epoch) for c in store.children(parent_id)] == [
            (c.owner, c.lease_epoch) for c in children
        ]
        assert worker(db_url) == 0
        finished = check_tree(store, parent_id)
        assert [c.id for c in finished] == [c.id for c in children]
        assert [r.recovery_attempts for r in store.tree(parent_id)] == [0, 0, 0]
    finally:
        store.close()


def test_killed_before_the_children_results_a_reaper_recovers_the_parent(db_url: str) -> None:
    """``before_child_results``: both children answered, the transaction that stopped the
    last one made the lead ready, and the worker that claimed it dies before storing
    their results. A reaper (another process) recovers the lead; the results are stored
    once each, and no child is started again."""
    parent_id = start(db_url)
    assert worker(db_url, failpoints="before_child_results=crash") == 137
    store = Store(db_url)
    try:
        parent = run(store, parent_id)
        assert parent.state is RunState.RUNNING and parent.owner is not None
        children = store.children(parent_id)
        assert [c.state for c in children] == [RunState.ANSWERED] * len(TASKS)
        calls = helper_calls(store, parent_id)
        assert not [i for i, _ in results(store, parent_id) if i in calls]
        assert sorted(notes().values()) == [1, 1]
        wait_stale(store, parent_id)
        assert reap(db_url)["recovered"] == [parent_id]
        # The reaper stored the results (the first unanswered group is the children's)
        # and handed the lead back to the workers.
        after = run(store, parent_id)
        assert after.state is RunState.RUNNING and after.owner is None
        assert [(i, c) for i, c in results(store, parent_id) if i in calls] == [
            (call_id, {"answer": HELPER_ANSWER}) for call_id in calls
        ]
        assert worker(db_url) == 0
        finished = check_tree(store, parent_id)
        assert [c.id for c in finished] == [c.id for c in children]
        assert run(store, parent_id).recovery_attempts == 1
        assert [c.recovery_attempts for c in finished] == [0, 0]
    finally:
        store.close()


def test_a_child_killed_after_its_write_is_reconciled_and_its_parent_wakes(
    db_url: str,
) -> None:
    """``after_tool_commit:file_note`` in a child: the worker carrying the child dies
    after its write committed downstream and before its result was stored. The reaper
    takes the child (never the waiting lead) and reconciles the write by its key, so the
    downstream holds one effect for it; the child answers, and the lead wakes and answers."""
    parent_id = start(db_url)
    code = worker(db_url, "--concurrency", "1", failpoints="after_tool_commit:file_note=crash")
    assert code == 137
    store = Store(db_url)
    try:
        parent = run(store, parent_id)
        assert parent.state is RunState.WAITING and parent.owner is None
        children = store.children(parent_id)
        crashed = [c for c in children if c.owner is not None]
        assert len(crashed) == 1 and crashed[0].state is RunState.RUNNING
        dead = crashed[0]
        assert list(notes()) == [key for key in notes() if key.startswith(f"{dead.id}:")]
        assert len(notes()) == 1 and results(store, dead.id) == []
        wait_stale(store, dead.id)
        assert reap(db_url)["recovered"] == [dead.id]
        reconciled = [e.data for e in store.events(dead.id) if e.kind == "reconciled"]
        assert [e["tool"] for e in reconciled] == ["file_note"]
        assert run(store, parent_id).state is RunState.WAITING
        assert worker(db_url) == 0
        check_tree(store, parent_id)
        attempts = {r.id: r.recovery_attempts for r in store.tree(parent_id)}
        assert attempts == {r.id: int(r.id == dead.id) for r in store.tree(parent_id)}
    finally:
        store.close()
