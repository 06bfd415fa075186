"""Links in notices from a ``tether worker`` process (reference §5, ``TETHER_PUBLIC_URL``):
a worker has no address of its own, so its notices' links start with the public URL, from
the environment or ``--public-url`` (the flag wins); a worker that posts notices to a
webhook without one says so at start; a public URL that is not an http(s) URL with a host
is refused at start."""

from __future__ import annotations

import json
from typing import Any

import inprocess
import processes
import webhooks
from waiting import run_sync

PUBLIC = "https://tether.example.com/ops"


def _suspend_one(url: str, *flags: str, **env: str) -> tuple[dict[str, Any], str]:
    """A run started here, carried by a worker process to its suspension (the worker then
    exits, idle): the notice its webhook got, and the worker's output."""
    engine = inprocess.engine(url, script_name="send")
    try:
        run_id = run_sync(engine.start_run("dana", "send it")).id
    finally:
        engine.close()
    with webhooks.receiver() as receiver:
        env = {"KIT_SCRIPT": "send", "TETHER_WEBHOOK_URL": receiver.url, **env}
        done = processes.tether(
            "worker", "--exit-when-idle", "--no-reap", *flags, env=processes.tether_env(url, **env)
        )
        assert done.returncode == 0, done.stderr[-3000:]
        [notice] = [n for n in receiver.notices if n["run_id"] == run_id]
    return notice, done.stderr


def test_a_workers_notice_links_start_with_the_public_url(db_url: str) -> None:
    notice, output = _suspend_one(db_url, TETHER_PUBLIC_URL=PUBLIC + "/")
    assert notice["approve_url"] == f"{PUBLIC}/approve/{notice['token']}"
    assert "TETHER_PUBLIC_URL" not in output


def test_the_public_url_flag_beats_the_environment(sqlite_url: str) -> None:
    notice, _ = _suspend_one(
        sqlite_url,
        "--public-url",
        "https://approvals.example.com",
        TETHER_PUBLIC_URL=PUBLIC,
    )
    assert notice["approve_url"] == f"https://approvals.example.com/approve/{notice['token']}"


def test_a_worker_with_a_webhook_and_no_public_url_warns_once_at_start(sqlite_url: str) -> None:
    notice, output = _suspend_one(sqlite_url)
    warnings = [
        line
        for line in output.splitlines()
        if line.startswith("{") and "TETHER_PUBLIC_URL" in json.loads(line)["msg"]
    ]
    assert len(warnings) == 1 and "--public-url" in warnings[0]
    assert json.loads(warnings[0])["level"] == "warning"
    assert notice["approve_url"] == f"/approve/{notice['token']}"


def test_a_bad_public_url_is_refused_at_start(sqlite_url: str) -> None:
    env = processes.tether_env(sqlite_url, TETHER_PUBLIC_URL="tether.example.com")
    refused = processes.tether("worker", "--exit-when-idle", env=env)
    assert refused.returncode == 1 and "TETHER_PUBLIC_URL" in refused.stderr
    flag = processes.tether(
        "worker",
        "--exit-when-idle",
        "--public-url",
        "ftp://x",
        env=processes.tether_env(sqlite_url),
    )
    assert flag.returncode == 1 and "--public-url" in flag.stderr
    served = processes.tether(
        "serve", "--public-url", "/relative", env=processes.tether_env(sqlite_url)
    )
    assert served.returncode == 1 and "--public-url" in served.stderr


def test_with_no_webhook_a_worker_logs_the_run_and_tool_and_no_link_unless_asked(
    sqlite_url: str,
) -> None:
    def suspend(**env: str) -> tuple[str, list[dict[str, Any]]]:
        engine = inprocess.engine(sqlite_url, script_name="send")
        try:
            run_id = run_sync(engine.start_run("dana", "send it")).id
        finally:
            engine.close()
        env = {"KIT_SCRIPT": "send", "TETHER_PUBLIC_URL": PUBLIC, **env}
        done = processes.tether(
            "worker", "--exit-when-idle", "--no-reap", env=processes.tether_env(sqlite_url, **env)
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
        return run_id, [line for line in lines if line.get("action") == "suspension_notice"]

    run_id, [logged] = suspend()
    assert logged["run_id"] == run_id and logged["tool"] == "send"
    assert "approvals list" in logged["msg"]
    assert "approve_url" not in logged and "/approve/" not in json.dumps(logged)
    run_id, [logged] = suspend(TETHER_LOG_APPROVAL_LINKS="1")
    assert logged["run_id"] == run_id
    assert logged["approve_url"].startswith(f"{PUBLIC}/approve/")
