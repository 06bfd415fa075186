"""``tether approvals list`` with the demo agent, in real processes, as an operator meets it:
the requests a manager may decide are found through the demo's CRM (started by the command
as ``approve`` starts it), each shown with what is being approved, and a CRM that cannot be
reached is an error, never "nothing is waiting"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import demo_procs
import httpx
import processes
from waiting import poll_until

QUESTION = "Draft and send a quote for Henderson, 200 of SKU-4411"


def tether(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A ``tether`` command with the demo agent (the default), in ``cwd``: where the demo's
    sandbox keeps its data on PostgreSQL (beside the file on SQLite)."""
    return processes.tether(*args, env=env, timeout=120, agent=None, cwd=cwd)


def test_approvals_list_as_the_manager_finds_the_send_and_shows_what_it_would_do(
    db_url: str, tmp_path: Path
) -> None:
    env = demo_procs.demo_env(TETHER_DATABASE_URL=db_url)
    for step in (
        ("migrate",),
        # A bidirectional control in the question: shown escaped, never obeyed.
        ("ask", f"{QUESTION} \u202e4471", "--as", "dana"),
        ("worker", "--exit-when-idle"),
    ):
        done = tether(*step, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    listed = tether("approvals", "list", "--as", "miguel", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    shown = listed.stdout
    assert "Nothing is waiting" not in shown
    assert f"{QUESTION} \\u202e4471" in shown and "\u202e" not in shown
    assert "hidden characters are shown escaped" in shown
    assert "send_quote" in shown and '"account_name": "Henderson"' in shown
    assert '"total": 2376.0' in shown
    # Whole lines without a terminal: nothing of the request is cut to 80 columns.
    assert any(len(line) > 80 for line in shown.splitlines())

    unreachable = demo_procs.demo_env(
        TETHER_DATABASE_URL=db_url, TETHER_SANDBOX_URL=demo_procs.closed_url()
    )
    refused = tether("approvals", "list", "--as", "miguel", env=unreachable, cwd=tmp_path)
    assert refused.returncode == 1
    assert "sandbox_unavailable" in refused.stderr
    assert "Nothing is waiting" not in refused.stdout + refused.stderr
    # The operator's view asks nobody's scope: it lists the send without the CRM.
    everyone = tether("approvals", "list", env=unreachable, cwd=tmp_path)
    assert everyone.returncode == 0, everyone.stderr[-3000:]
    assert "send_quote" in everyone.stdout


def test_a_command_beside_serve_uses_the_sandbox_serve_runs(db_url: str, tmp_path: Path) -> None:
    """``tether serve`` (no TETHER_SANDBOX_URL) serves the demo's sandbox in-process and says
    where beside its data; a command a person runs then uses that sandbox rather than
    start its own (a failure armed in serve's sandbox is the one the command meets), and
    once serve has stopped it starts its own again."""
    env = demo_procs.demo_env(TETHER_DATABASE_URL=db_url)
    advert = tmp_path / "sandbox.db.serving"
    with demo_procs.serving(env, tmp_path / "serve.log") as base:
        started = httpx.post(
            f"{base}/v1/runs", headers=demo_procs.DANA, json={"question": QUESTION}, timeout=30
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["id"]
        stopped = poll_until(lambda: demo_procs.stopped(base, run_id), timeout=60, what="a stop")
        assert stopped["state"] == "suspended"
        crm = json.loads(advert.read_text())["url"]
        armed = httpx.post(
            f"{crm}/admin/failures",
            json={"route": "GET /users/{user_id}/permissions", "kind": "fail_before_commit"},
            timeout=10,
        )
        assert armed.status_code == 200, armed.text

        met = tether("approvals", "list", "--as", "miguel", env=env, cwd=tmp_path)
        assert met.returncode == 1 and "sandbox_unavailable" in met.stderr
        listed = tether("approvals", "list", "--as", "miguel", "--json", env=env, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr[-3000:]
        assert [i["run_id"] for i in json.loads(listed.stdout)["items"]] == [run_id]
    assert not advert.exists()  # taken back when serve stopped
    alone = tether("approvals", "list", "--as", "miguel", "--json", env=env, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert [i["run_id"] for i in json.loads(alone.stdout)["items"]] == [run_id]
