"""The demo story as a test: each scene is played on both stores, and its outcome is checked
in the sandbox's and the store's own records (quote counts, run states, ledger, events),
never in the printed text (but for one test: the story says when it resets the CRM). One
test runs ``tether demo`` itself and checks its exit code; another follows the README's
service walkthrough with real processes."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import processes
import pytest
from rich.console import Console
from waiting import poll_until

from tether.demo import scenes, story
from tether.demo.stage import SceneResult, Stage, open_stage
from tether.results import LiveEvent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def stage(db_url: str) -> AsyncIterator[Stage]:
    async with open_stage(Console(quiet=True), database_url=db_url) as opened:
        yield opened


def henderson(stage: Stage) -> dict[str, Any]:
    response = stage.crm.get("/admin/quotes", params={"account_id": "4471"})
    assert response.status_code == 200
    found: dict[str, Any] = response.json()
    return found


def quotes_of(stage: Stage, run_id: str) -> list[dict[str, Any]]:
    return [q for q in henderson(stage)["quotes"] if q["created_key"].startswith(f"{run_id}:")]


async def events(stage: Stage, run_id: str, kind: str) -> list[LiveEvent]:
    return [e for e in await stage.engine.events(run_id) if e.kind == kind]


async def ledger(stage: Stage, run_id: str) -> list[tuple[str, str, str]]:
    return [(e.tool_call_id, e.tool, e.status.value) for e in await stage.engine.ledger(run_id)]


DEMO_CALLS = [
    ("call_0_0", "find_account"),
    ("call_1_0", "get_pricing"),
    ("call_2_0", "draft_quote"),
    ("call_3_0", "send_quote"),
]


async def test_the_send_suspends_and_two_concurrent_approvals_resume_it_once(
    stage: Stage,
) -> None:
    first = await scenes.scene_suspend(stage)
    assert first.run_id is not None
    run_id = first.run_id
    suspended = (await stage.engine.get_run(run_id)).run
    assert suspended.state.value == "suspended"
    assert suspended.pending is not None and suspended.pending.tool == "send_quote"
    assert (henderson(stage)["drafted"], henderson(stage)["sent"]) == (1, 0)
    assert await ledger(stage, run_id) == [
        *[(i, t, "ok") for i, t in DEMO_CALLS[:3]],
        ("call_3_0", "send_quote", "intent"),
    ]

    second = await scenes.scene_double_approval(stage, run_id)

    answered = (await stage.engine.get_run(run_id)).run
    assert answered.state.value == "answered"
    decisions = await events(stage, run_id, "approved")
    assert [(e.data["decision"], e.data["by"]) for e in decisions] == [("approve", "dana")]
    assert await ledger(stage, run_id) == [(i, t, "ok") for i, t in DEMO_CALLS]
    counts = henderson(stage)
    assert (counts["drafted"], counts["sent"]) == (1, 1)
    assert counts["quotes"][0]["sent_key"] == f"{run_id}:call_3_0"
    assert first.ok and second.ok, (first, second)
    assert second.observed["already_resumed"] == 1


async def test_a_worker_killed_after_the_draft_commits_leaves_exactly_one_quote(
    stage: Stage,
) -> None:
    result = await scenes.scene_crash(stage)

    assert result.run_id is not None
    run = (await stage.engine.get_run(result.run_id)).run
    assert run.state.value == "answered"
    assert run.recovery_attempts == 1
    reconciled = await events(stage, result.run_id, "reconciled")
    assert [(e.data["tool"], e.data["found"]) for e in reconciled] == [("draft_quote", "found")]
    assert await ledger(stage, result.run_id) == [(i, t, "ok") for i, t in DEMO_CALLS]
    own = quotes_of(stage, result.run_id)
    assert [(q["created_key"], q["status"]) for q in own] == [(f"{result.run_id}:call_2_0", "sent")]
    assert result.observed["exit_code"] == 137
    assert result.ok, result


async def test_a_halted_run_is_continued_by_its_owner_without_repeating_a_call(
    stage: Stage,
) -> None:
    result = await scenes.scene_budget(stage)

    assert result.run_id is not None
    run = (await stage.engine.get_run(result.run_id)).run
    assert run.state.value == "suspended"
    assert run.limits.max_steps == 6
    assert run.budget.steps == 4
    halts = await events(stage, result.run_id, "halted")
    assert [e.data["budget"]["steps"] for e in halts] == [2]
    grants = await events(stage, result.run_id, "continued")
    assert len(grants) == 1
    grant = grants[0].data
    assert (grant["by"], grant["previous_halt_reason"]) == ("dana", "max_steps")
    assert (grant["old_limits"]["max_steps"], grant["new_limits"]["max_steps"]) == (2, 6)
    assert grant["why"]
    assert await ledger(stage, result.run_id) == [
        *[(i, t, "ok") for i, t in DEMO_CALLS[:3]],
        ("call_3_0", "send_quote", "intent"),
    ]
    messages = (await stage.engine.get_run(result.run_id)).messages
    calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert calls == [i for i, _ in DEMO_CALLS]
    assert len(quotes_of(stage, result.run_id)) == 1
    assert result.ok, result


async def test_a_stale_approval_is_refused_and_nothing_is_sent(stage: Stage) -> None:
    result = await scenes.scene_stale_approval(stage)

    assert result.run_id is not None
    view = await stage.engine.get_run(result.run_id)
    assert view.run.state.value == "answered"
    assert await ledger(stage, result.run_id) == [
        *[(i, t, "ok") for i, t in DEMO_CALLS[:3]],
        ("call_3_0", "send_quote", "error"),
    ]
    send_result = json.loads(view.messages[-2]["content"])
    assert send_result["error"] == "guard_failed"
    assert "credit hold" in send_result["message"]
    decisions = await events(stage, result.run_id, "approved")
    assert [(e.data["decision"], e.data["by"]) for e in decisions] == [
        ("approve", "dana"),
        ("approve", "miguel"),
    ]
    assert len(await events(stage, result.run_id, "suspended")) == 2
    counts = henderson(stage)
    assert (counts["drafted"], counts["sent"]) == (1, 0)
    assert result.observed["first"] == "changed"
    assert {"discount_tier", "discount_pct", "total"} <= set(result.observed["diff"])
    assert result.observed["second"] == "guard_failed"
    assert result.ok, result


async def test_the_stale_approval_scene_says_it_puts_the_crm_back_before_counting(
    db_url: str,
) -> None:
    printed = io.StringIO()
    async with open_stage(Console(file=printed, width=200), database_url=db_url) as stage:
        await scenes.scene_stale_approval(stage)
    text = printed.getvalue()
    assert "put back to its seed" in text
    assert text.index("put back to its seed") < text.index("before 0")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``story.main`` configures the root logger; put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def test_the_demo_exits_non_zero_when_a_scene_goes_wrong(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    async def broken(stage: Stage) -> SceneResult:
        raise RuntimeError("the CRM is on fire")

    monkeypatch.setattr(story, "scene_budget", broken)

    # On a thread of its own: main() runs its own event loop, as the CLI does.
    assert await asyncio.to_thread(story.main) == 1


def test_tether_demo_exits_zero() -> None:
    """``tether demo`` plays its story to the end; how long it takes (well within a
    minute) is ``benchmarks/demo.py``'s to measure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    done = subprocess.run(
        [sys.executable, "-m", "tether", "demo"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The first scene shows the model's text as it was written (its deltas), one line a step.
    assert "model: Let me find Henderson in the CRM first.\n" in done.stdout


# The README's "As a service" walkthrough, word for word.
README_QUESTION = "Draft and send a quote for Henderson, 200 of SKU-4411"
STOP_DEADLINE_S = 30


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _state(base: str, run_id: str, log: Path) -> str | None:
    """The run's state once it has stopped moving (anything but ``running``), else None."""
    response = httpx.get(
        f"{base}/v1/runs/{run_id}", headers={"Authorization": "Bearer tether-demo-dana"}
    )
    assert response.status_code == 200, response.text + log.read_text()[-3000:]
    state: str = response.json()["state"]
    return None if state == "running" else state


DANA = {"Authorization": "Bearer tether-demo-dana"}
MIGUEL = {"Authorization": "Bearer tether-demo-miguel"}


def _get(base: str, path: str, headers: dict[str, str]) -> dict[str, Any]:
    response = httpx.get(f"{base}{path}", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _readme_run(base: str, log: Path) -> str:
    """The README's run, started as dana and carried to its stop: the send waits."""
    response = httpx.post(
        f"{base}/v1/runs", headers=DANA, json={"question": README_QUESTION}, timeout=30
    )
    assert response.status_code == 202, response.text
    run_id: str = response.json()["id"]
    state = poll_until(lambda: _state(base, run_id, log), timeout=60, what="a stop")
    assert state == "suspended", log.read_text()[-3000:]
    return run_id


@contextmanager
def _stream_until_suspended(base: str, run_id: str) -> Iterator[list[str]]:
    """The run's live events read through ``suspended``, the stream left open inside."""
    url = f"{base}/v1/runs/{run_id}/events/stream"
    with httpx.stream("GET", url, headers=DANA, timeout=30) as stream:
        kinds: list[str] = []
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: "))
            if kinds[-1:] == ["suspended"]:
                break
        yield kinds


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_the_readmes_service_walkthrough_suspends_the_send_with_no_sandbox_configured(
    empty_url: str, tmp_path: Path
) -> None:
    """``tether serve --workers 1`` on an empty database, with no TETHER_SANDBOX_URL: the
    demo users exist, the sandbox starts in-process (and the log says where), the README's
    run reaches ``suspended`` on the send, its live event stream shows it, miguel finds the
    request in ``GET /v1/approvals`` and decides it by run and call id (no log read), the
    run answers, and SIGTERM stops everything with exit 0 while a stream is still open."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TETHER_DATABASE_URL"] = empty_url
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", "serve", "--port", str(port), "--workers", "1"],
            env=env,
            cwd=tmp_path,  # where a PostgreSQL setup keeps the sandbox's data
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        poll_until(
            lambda: processes.serve_ready(proc, base, log), timeout=60, what="serve to be ready"
        )
        run_id = _readme_run(base, log)
        # The README's `curl -sN …/events/stream`: the run's events so far, then the stream
        # stays open while the run waits.
        with _stream_until_suspended(base, run_id) as kinds:
            assert kinds[0] == "created", kinds
        # Then miguel finds the request in `GET /v1/approvals` and decides it by run and
        # call id, without reading a log; the run goes on to its answer.
        (request,) = _get(base, "/v1/approvals", MIGUEL)["items"]
        assert request["run_id"] == run_id and request["tool"] == "send_quote"
        decided = httpx.post(
            request["decide_url"],
            headers=MIGUEL,
            json={"decisions": [{"tool_call_id": request["tool_call_id"], "decision": "approve"}]},
            timeout=30,
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["results"][0]["outcome"] == "executed", decided.text
        done = poll_until(lambda: _state(base, run_id, log), timeout=60, what="the answer")
        assert done == "answered", log.read_text()[-3000:]
        # SIGTERM while a stream is open (another run waiting) still stops everything with 0.
        with _stream_until_suspended(base, _readme_run(base, log)):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=STOP_DEADLINE_S) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_DEADLINE_S)
    started = [
        json.loads(line) for line in log.read_text().splitlines() if '"sandbox_started"' in line
    ]
    assert [entry["db_path"] for entry in started] == [str(tmp_path / "sandbox.db")]
