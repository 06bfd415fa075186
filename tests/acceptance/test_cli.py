"""The command line as an operator uses it: exit codes, refusals, migrations."""

from __future__ import annotations

import json
import re
from typing import Any

import agents
import downstream
import inprocess
import processes
import pytest
import trees
from alembic import command
from waiting import poll_until, run_sync

from tether import Engine, StopKind
from tether.config import Settings
from tether.notify import MemoryNotifier
from tether.runs import RunState
from tether.store import SchemaStatus, Store, schema_status
from tether.store.migrate import alembic_config


def _json(text: str) -> dict[str, object]:
    return json.loads(text)  # type: ignore[no-any-return]


def test_approve_exits_0_when_it_took_effect_and_1_with_the_code_when_refused(
    db_url: str,
) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    run_id = engine.sync.ask("dana", "send").run_id
    token = notifier.last(run_id).token
    engine.close()
    env = processes.tether_env(db_url)

    stranger = processes.tether("approve", token, "--as", "mallory", env=env)
    assert stranger.returncode == 1 and "unknown_or_expired" in stranger.stderr
    done = processes.tether("approve", token, env=env)
    assert done.returncode == 0, done.stderr
    assert _json(done.stdout)["outcome"] == "executed"
    again = processes.tether("approve", token, "--decline", env=env)
    assert again.returncode == 1 and "already_resumed" in again.stderr
    unknown = processes.tether("approve", "no-such-token", env=env)
    assert unknown.returncode == 1 and "unknown_or_expired" in unknown.stderr
    assert len(downstream.effects()) == 1


def test_approve_of_an_expired_token_tells_the_owner_how_to_continue_and_nobody_else(
    db_url: str,
) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(
        db_url, script_name="send", notifier=notifier, suspension_ttl_min=0.0005
    )
    run_id = engine.sync.ask("dana", "send").run_id
    token = notifier.last(run_id).token
    run = engine.runner.store.get_run(run_id)
    assert run is not None and run.expires_at is not None
    poll_until(lambda: engine.runner.store.now() > (run.expires_at or 0))
    assert run_sync(engine.runner.expire_suspended()) == [run_id]
    engine.close()
    env = processes.tether_env(db_url)

    owner = processes.tether("approve", token, env=env)  # acts as the token's owner
    assert owner.returncode == 1 and "unknown_or_expired" in owner.stderr
    told = _json(owner.stdout)
    assert told["run_id"] == run_id and told["halt_reason"] == "suspension_expired"
    assert f"tether continue {run_id}" in str(told["message"])
    stranger = processes.tether("approve", token, "--as", "boss", env=env)
    assert stranger.returncode == 1
    unknown = processes.tether("approve", "x" * 43, "--as", "boss", env=env)
    assert _json(stranger.stdout) == _json(unknown.stdout)  # as if there were no such run
    assert downstream.effects() == []


def test_approve_takes_a_reason_and_edited_arguments_with_the_digest_of_their_preview(
    db_url: str,
) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    first = engine.sync.ask("dana", "send").run_id
    second = engine.sync.ask("dana", "send").run_id
    token, other = notifier.last(first).token, notifier.last(second).token
    shown = run_sync(engine.preview_approval(token, "dana", {"item": "c"}))
    engine.close()
    env = processes.tether_env(db_url)

    bad = processes.tether("approve", token, "--arguments", "{not json", env=env)
    assert bad.returncode == 1 and "invalid_input" in bad.stderr
    wrong = processes.tether("approve", token, "--arguments", '{"item": 1}', env=env)
    assert wrong.returncode == 1 and "invalid_input" in wrong.stderr
    edited = ("--arguments", '{"item": "c"}', "--digest", str(shown.digest))
    done = processes.tether("approve", token, *edited, "--reason", "c it is", env=env)
    assert done.returncode == 0, done.stderr
    assert _json(done.stdout)["outcome"] == "executed"
    assert [item for _, _, item in downstream.effects()] == ["c"]
    declined = processes.tether("approve", other, "--decline", "--reason", "not now", env=env)
    assert declined.returncode == 0, declined.stderr
    store = Store(db_url)
    try:
        (decided,) = [e.data for e in store.events(second) if e.kind == "declined"]
    finally:
        store.close()
    assert decided["reason"] == "not now"


def test_approvals_list_finds_requests_and_approve_by_run_decides_one_without_its_token(
    db_url: str,
) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    danas = engine.sync.ask("dana", "send").run_id
    miguels = engine.sync.ask("miguel", "send").run_id
    token = notifier.last(danas).token
    engine.close()
    env = processes.tether_env(db_url)

    everything = processes.tether("approvals", "list", "--json", env=env)
    assert everything.returncode == 0, everything.stderr
    listed = _json(everything.stdout)
    items = listed["items"]
    assert isinstance(items, list) and [i["run_id"] for i in items] == [danas, miguels]
    assert listed["more"] == 0
    as_miguel = processes.tether("approvals", "list", "--as", "miguel", "--json", env=env)
    assert [i["run_id"] for i in json.loads(as_miguel.stdout)["items"]] == [miguels]
    table = processes.tether("approvals", "list", "--limit", "1", env=env)
    assert table.returncode == 0 and danas in table.stdout, table.stderr
    cursor = re.search(r"1 more: --after (\S+)", table.stdout)
    assert cursor is not None, table.stdout
    rest = processes.tether("approvals", "list", "--after", cursor.group(1), "--json", env=env)
    after = json.loads(rest.stdout)["items"]
    assert [i["run_id"] for i in after] == [miguels], rest.stderr

    shown = processes.tether("approvals", "preview", token, "--arguments", '{"item": "c"}', env=env)
    assert shown.returncode == 0, shown.stderr
    preview = _json(shown.stdout)
    assert preview["preview"] == {"item": "c", "price": "100"} and len(str(preview["digest"])) == 64
    stranger = processes.tether("approvals", "preview", token, "--as", "mallory", env=env)
    assert stranger.returncode == 1 and "unknown_or_expired" in stranger.stderr

    both = processes.tether("approve", token, "--run", danas, env=env)
    assert both.returncode == 1 and "invalid_input" in both.stderr
    refused = processes.tether("approve", "--run", danas, "--as", "mallory", env=env)
    assert refused.returncode == 1 and "not_found" in refused.stderr
    done = processes.tether("approve", "--run", danas, env=env)
    assert done.returncode == 0, done.stderr
    assert _json(done.stdout)["outcome"] == "executed"
    call_id = _json(done.stdout)["tool_call_id"]
    again = processes.tether(
        "approve", "--run", danas, "--tool-call-id", str(call_id), "--decline", env=env
    )
    assert again.returncode == 1 and "already_resumed" in again.stderr
    nothing = processes.tether("approve", "--run", danas, env=env)
    assert nothing.returncode == 1 and "unknown_or_expired" in nothing.stderr
    assert len(downstream.effects()) == 1


def test_a_turn_of_two_sends_is_listed_shown_and_decided_call_by_call(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="two_sends", notifier=notifier)
    run_id = engine.sync.ask("dana", "send b and c").run_id
    b, c = (n.tool_call_id for n in notifier.notices if n.run_id == run_id)
    engine.close()
    env = processes.tether_env(db_url)

    shown = processes.tether("runs", "show", run_id, env=env)
    assert shown.returncode == 0, shown.stderr
    calls = _json(shown.stdout)["pending_calls"]
    assert isinstance(calls, list)
    assert [(x["tool"], x["tool_call_id"], x["decided"]) for x in calls] == [
        ("send", b, None),
        ("send", c, None),
    ]
    listed = _json(processes.tether("approvals", "list", "--json", env=env).stdout)["items"]
    assert isinstance(listed, list)
    assert [(i["run_id"], i["tool_call_id"]) for i in listed] == [(run_id, b), (run_id, c)]
    table = processes.tether("approvals", "list", env=env)
    assert table.returncode == 0 and b in table.stdout and c in table.stdout

    which = processes.tether("approve", "--run", run_id, env=env)
    assert which.returncode == 1 and "invalid_input" in which.stderr
    assert "--call" in which.stderr and b in which.stderr and c in which.stderr
    recorded = processes.tether("approve", "--run", run_id, "--call", c, "--decline", env=env)
    assert recorded.returncode == 0, recorded.stderr
    answer = _json(recorded.stdout)
    assert (answer["tool_call_id"], answer["outcome"], answer["waiting_for"]) == (c, "recorded", 1)
    assert downstream.effects() == []
    calls = _json(processes.tether("runs", "show", run_id, env=env).stdout)["pending_calls"]
    assert isinstance(calls, list)
    assert [x["decided"] and x["decided"]["decision"] for x in calls] == [None, "decline"]
    # One call left: it is the default.
    done = processes.tether("approve", "--run", run_id, env=env)
    assert done.returncode == 0, done.stderr
    assert (_json(done.stdout)["tool_call_id"], _json(done.stdout)["outcome"]) == (b, "executed")
    assert [item for _, _, item in downstream.effects()] == ["b"]


def test_continue_cancel_and_runs_show(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    halted = engine.sync.ask("dana", "go", limits={"max_steps": 1})
    assert halted.reason == "max_steps"
    engine.close()
    env = processes.tether_env(db_url)

    shown = processes.tether("runs", "show", halted.run_id, env=env)
    assert shown.returncode == 0
    data = _json(shown.stdout)
    assert data["state"] == "halted" and data["halt_reason"] == "max_steps"
    assert data["budget"]["consumed"]["steps"] == 1  # type: ignore[index]
    assert [m["role"] for m in data["messages"]][:2] == ["system", "user"]  # type: ignore[attr-defined]

    continued = processes.tether("continue", halted.run_id, env=env)
    assert continued.returncode == 0, continued.stderr
    assert _json(continued.stdout)["budget"]["limits"]["max_steps"] == 5  # type: ignore[index]
    not_halted = processes.tether("continue", halted.run_id, env=env)
    assert not_halted.returncode == 1 and "not_halted" in not_halted.stderr

    cancelled = processes.tether("cancel", halted.run_id, env=env)
    assert cancelled.returncode == 0 and _json(cancelled.stdout)["state"] == "cancelled"
    again = processes.tether("cancel", halted.run_id, env=env)
    assert again.returncode == 1 and "already_finished" in again.stderr
    missing = processes.tether("runs", "show", "nope", env=env)
    assert missing.returncode == 1 and "not_found" in missing.stderr
    listed = processes.tether("runs", "list", env=env)
    assert listed.returncode == 0 and halted.run_id[:8] in listed.stdout

    # The cancelled run's events, one JSON line each, then the command ends (terminal).
    watched = processes.tether("runs", "watch", halted.run_id, env=env)
    assert watched.returncode == 0, watched.stderr
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))
    assert lines[0]["kind"] == "created" and lines[-1]["kind"] == "cancelled"
    tail = processes.tether("runs", "watch", halted.run_id, "--after", str(len(lines) - 1), env=env)
    assert [json.loads(line)["kind"] for line in tail.stdout.splitlines()] == ["cancelled"]
    unknown = processes.tether("runs", "watch", "nope", env=env)
    assert unknown.returncode == 1 and "not_found" in unknown.stderr


def test_worker_refuses_an_older_schema_and_migrate_brings_it_up(db_url: str) -> None:
    store = Store(db_url)
    with store.engine.begin() as conn:  # the schema as the first release left it
        config = alembic_config(store.engine)
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
    env = processes.tether_env(db_url)
    refused = processes.tether("worker", "--exit-when-idle", env=env)
    assert refused.returncode == 1
    assert "tether migrate" in refused.stderr
    migrated = processes.tether("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert schema_status(store.engine) is SchemaStatus.CURRENT
    worker = processes.tether("worker", "--exit-when-idle", env=env)
    assert worker.returncode == 0, worker.stderr
    store.close()


def test_worker_migrates_an_empty_sqlite_database_on_start(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    worker = processes.tether("worker", "--exit-when-idle", env=processes.tether_env(url))
    assert worker.returncode == 0, worker.stderr
    store = Store(url)
    assert schema_status(store.engine) is SchemaStatus.CURRENT
    store.close()


def test_a_bad_failpoint_or_setting_is_a_clear_error(db_url: str) -> None:
    env = processes.tether_env(db_url, TETHER_FAILPOINTS="nowhere=crash")
    bad = processes.tether("worker", "--exit-when-idle", env=env)
    assert bad.returncode != 0 and "bad failpoint" in bad.stderr
    env = processes.tether_env(db_url, TETHER_HEARTBEAT_TIMEOUT_S="soon")
    bad = processes.tether("reap", env=env)
    assert bad.returncode == 1 and "TETHER_HEARTBEAT_TIMEOUT_S" in bad.stderr


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
async def test_migrate_creates_the_agents_published_users_and_users_add_prints_a_working_key(
    empty_url: str,
) -> None:
    env = processes.tether_env(empty_url)
    demo = processes.tether("migrate", env=env, agent=None)  # the default agent: the demo's
    assert demo.returncode == 0, demo.stderr
    added = processes.tether("users", "add", "erin", env=env)
    assert added.returncode == 0, added.stderr
    key = added.stdout.strip()

    async with inprocess.engine(empty_url) as engine:
        owners = [
            await engine.web.user_for_key(k)
            for k in ("tether-demo-dana", "tether-demo-miguel", key, "tether-demo-nobody")
        ]
    assert owners == ["dana", "miguel", "erin", None]


def test_approve_as_the_owner_of_a_four_eyes_call_is_refused_and_says_to_name_another(
    db_url: str,
) -> None:
    notifier = MemoryNotifier()
    engine = Engine(
        agent=agents.four_eyes_agent(),
        model=agents.four_eyes_script("transfer"),
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    run_id = engine.sync.ask("dana", "transfer b").run_id
    token = notifier.last(run_id).token
    # Scripts find the request with the blocking API as well.
    assert [run.id for run in engine.sync.pending_approvals("boss")] == [run_id]
    assert engine.sync.events(run_id)[-1].seq == len(engine.sync.events(run_id))
    engine.close()
    env = processes.tether_env(db_url)
    four_eyes = "agents:four_eyes_agent"

    by_default = processes.tether("approve", token, env=env, agent=four_eyes)
    assert by_default.returncode == 1 and "four_eyes" in by_default.stderr
    assert "--as" in by_default.stderr and _json(by_default.stdout)["error"] == "four_eyes"
    as_owner = processes.tether("approve", token, "--as", "dana", env=env, agent=four_eyes)
    assert as_owner.returncode == 1 and "four_eyes" in as_owner.stderr
    assert downstream.effects() == []
    done = processes.tether("approve", token, "--as", "boss", env=env, agent=four_eyes)
    assert done.returncode == 0, done.stderr
    assert _json(done.stdout)["outcome"] == "executed"
    assert [e[1] for e in downstream.effects()] == ["transfer"]


async def test_users_list_remove_and_rotate_key_revoke_keys_at_once(db_url: str) -> None:
    env = processes.tether_env(db_url)
    keys = {}
    for name in ("erin", "finn"):
        added = processes.tether("users", "add", name, env=env)
        assert added.returncode == 0, added.stderr
        keys[name] = added.stdout.strip()
    listed = processes.tether("users", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    items = _json(listed.stdout)["items"]
    assert isinstance(items, list)
    assert [(u["name"], u["keys"]) for u in items] == [("erin", 1), ("finn", 1)]
    assert keys["erin"] not in listed.stdout  # never a key
    rotated = processes.tether("users", "rotate-key", "erin", env=env)
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    removed = processes.tether("users", "remove", "finn", env=env)
    assert removed.returncode == 0, removed.stderr
    missing = processes.tether("users", "remove", "finn", env=env)
    assert missing.returncode == 1 and "not_found" in missing.stderr
    async with inprocess.engine(db_url) as engine:
        owners = [await engine.web.user_for_key(k) for k in (keys["erin"], new_key, keys["finn"])]
    assert owners == [None, "erin", None]


def test_ask_starts_a_thread_and_follow_ups_refused_or_queued_while_it_is_busy(
    db_url: str,
) -> None:
    env = processes.tether_env(db_url)
    nobody = processes.tether("ask", "q1", env=env)  # a new thread has no owner to default to
    assert nobody.returncode == 1 and "invalid_input" in nobody.stderr and "--as" in nobody.stderr
    started = processes.tether("ask", "q1", "--as", "dana", env=env)
    assert started.returncode == 0, started.stderr
    first = _json(started.stdout)
    # A new thread is named by its first run's id.
    assert first["state"] == "running" and first["thread_id"] == first["id"]
    thread = str(first["thread_id"])

    busy = processes.tether("ask", "q2", "--thread", thread, env=env)  # as the thread's owner
    assert busy.returncode == 1 and "thread_busy" in busy.stderr
    assert (
        f"waits on run {first['id']}" in busy.stderr and _json(busy.stdout)["run_id"] == first["id"]
    )
    queued = processes.tether("ask", "q2", "--thread", thread, "--if-busy", "enqueue", env=env)
    assert queued.returncode == 0, queued.stderr
    second = _json(queued.stdout)
    assert second["state"] == "queued" and second["thread_id"] == thread
    for refused, code in (
        (("ask", "q3", "--thread", thread, "--as", "boss"), "not_found"),  # not boss's thread
        (("ask", "q3", "--thread", "no-such-thread"), "not_found"),
        (("ask", "", "--thread", thread, "--if-busy", "enqueue"), "invalid_input"),
        (("ask", "q3", "--thread", thread, "--if-busy", "wait"), "invalid_input"),
    ):
        answer = processes.tether(*refused, env=env)
        assert answer.returncode == 1 and f"error {code}:" in answer.stderr, refused
    store = Store(db_url)
    try:
        assert [r.id for r in store.list_runs(None, limit=10)] == [second["id"], first["id"]]
    finally:
        store.close()


def test_ask_takes_a_priority_and_a_start_time_and_refuses_bad_ones(db_url: str) -> None:
    env = processes.tether_env(db_url, TETHER_MAX_PRIORITY="7")
    asked = processes.tether(
        "ask",
        "q",
        "--as",
        "dana",
        "--priority",
        "7",
        "--start-at",
        "2999-01-01T09:00:00+01:00",
        env=env,
    )
    assert asked.returncode == 0, asked.stderr
    assert _json(asked.stdout)["state"] == "queued"
    for bad in (("--priority", "11"), ("--priority", "8"), ("--start-at", "2999-01-01T09:00:00")):
        refused = processes.tether("ask", "q", "--as", "dana", *bad, env=env)
        assert refused.returncode == 1 and "error invalid_input:" in refused.stderr, bad
    store = Store(db_url)
    try:
        (run,) = store.list_runs(None, limit=10)
        assert (run.priority, run.start_at) == (7, 32472172800.0)
    finally:
        store.close()


def test_schedules_add_list_and_delete_and_refuse_bad_ones(db_url: str) -> None:
    env = processes.tether_env(db_url)
    add = ("schedules", "add", "0 9 * * 1", "weekly report", "--as", "dana")
    added = processes.tether(*add, "--timezone", "Europe/Paris", env=env)
    assert added.returncode == 0, added.stderr
    first: dict[str, Any] = json.loads(added.stdout)
    assert set(first) == {"id", "next_at"}
    for bad, code in (
        (("schedules", "add", "* * * * * *", "q", "--as", "dana"), "invalid_input"),
        (
            ("schedules", "add", "@daily", "q", "--as", "dana", "--timezone", "Nowhere/X"),
            "invalid_input",
        ),
        (("schedules", "delete", first["id"], "--as", "miguel"), "not_found"),
        (("schedules", "delete", "no-such-schedule"), "not_found"),
    ):
        answer = processes.tether(*bad, env=env)
        assert answer.returncode == 1 and f"error {code}:" in answer.stderr, bad
    listed = processes.tether("schedules", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (shown,) = json.loads(listed.stdout)["items"]
    assert (shown["id"], shown["user_id"], shown["timezone"]) == (
        first["id"],
        "dana",
        "Europe/Paris",
    )
    table = processes.tether("schedules", "list", env=env)
    assert first["id"] in table.stdout and "0 9 * * 1" in table.stdout
    mine = processes.tether("schedules", "list", "--as", "miguel", "--json", env=env)
    assert _json(mine.stdout)["items"] == []
    deleted = processes.tether("schedules", "delete", first["id"], env=env)  # as the owner
    assert deleted.returncode == 0, deleted.stderr
    assert _json(processes.tether("schedules", "list", "--json", env=env).stdout)["items"] == []


def test_threads_list_show_and_delete_as_the_owner_and_delete_is_refused_while_busy(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="answer")
    first = engine.sync.start_run("dana", "q1")
    second = engine.sync.start_run("dana", "q2", thread_id=first.thread_id, if_busy="enqueue")
    others = engine.sync.start_run("boss", "theirs")
    env = processes.tether_env(db_url)
    thread = first.thread_id

    refused = processes.tether("threads", "delete", thread, env=env)
    assert refused.returncode == 1 and "thread_busy" in refused.stderr
    assert _json(refused.stdout)["run_id"] == first.id
    for run in (first, second):
        assert engine.sync.run_until_stop(run.id).kind is StopKind.ANSWERED
    engine.close()

    every = processes.tether("threads", "list", "--json", env=env)
    assert every.returncode == 0, every.stderr
    assert [t["id"] for t in _json(every.stdout)["items"]] == [thread, others.thread_id]  # type: ignore[attr-defined]
    as_dana = processes.tether("threads", "list", "--as", "dana", env=env)
    assert as_dana.returncode == 0 and thread in as_dana.stdout
    assert others.thread_id not in as_dana.stdout

    shown = processes.tether("threads", "show", thread, env=env)
    assert shown.returncode == 0, shown.stderr
    data = _json(shown.stdout)
    assert data["user_id"] == "dana"
    assert [(r["id"], r["state"], r["question"]) for r in data["runs"]] == [  # type: ignore[attr-defined]
        (first.id, "answered", "q1"),
        (second.id, "answered", "q2"),
    ]
    assert data["consumed"]["steps"] == 2  # type: ignore[index]
    assert [m["role"] for m in data["messages"]] == [  # type: ignore[attr-defined]
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    stranger = processes.tether("threads", "show", thread, "--as", "boss", env=env)
    assert stranger.returncode == 1 and "not_found" in stranger.stderr
    not_theirs = processes.tether("threads", "delete", thread, "--as", "boss", env=env)
    assert not_theirs.returncode == 1 and "not_found" in not_theirs.stderr

    deleted = processes.tether("threads", "delete", thread, env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted thread {thread} and its 2 run(s)" in deleted.stdout
    gone = processes.tether("threads", "show", thread, env=env)
    assert gone.returncode == 1 and "not_found" in gone.stderr
    store = Store(db_url)
    try:
        assert [r.id for r in store.list_runs(None, limit=10)] == [others.id]
    finally:
        store.close()


def test_runs_tree_prints_each_run_indented_by_depth_with_its_halt_reason(db_url: str) -> None:
    engine = trees.engine(db_url, researcher_limits={"max_steps": 1})
    root = engine.sync.start_run("dana", "plan it")
    found = run_sync(trees.settle(engine, root.id))
    engine.close()
    store = Store(db_url)
    try:
        a, b = store.children(root.id)
        (check_a,), (check_b,) = store.children(a.id), store.children(b.id)
    finally:
        store.close()
    # A researcher's own step spent its limit, so its checker halts on the researcher's.
    assert found[check_a.id].halted_by == a.id and found[a.id].state is RunState.WAITING
    env = processes.tether_env(db_url)

    shown = processes.tether("runs", "tree", check_b.id, env=env, agent="trees:agent")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        f"{root.id}  planner  waiting",
        f"  {a.id}  researcher  waiting",
        f"    {check_a.id}  checker  halted  max_steps  (halted by {a.id})",
        f"  {b.id}  researcher  waiting",
        f"    {check_b.id}  checker  halted  max_steps  (halted by {b.id})",
    ]
    as_json = processes.tether("runs", "tree", a.id, "--json", env=env, agent="trees:agent")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["root_run_id"] == root.id
    assert [r["id"] for r in body["runs"]] == [root.id, a.id, check_a.id, b.id, check_b.id]
    unknown = processes.tether("runs", "tree", "nope", env=env, agent="trees:agent")
    assert unknown.returncode == 1 and "not_found" in unknown.stderr
