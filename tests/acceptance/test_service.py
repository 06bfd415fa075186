"""``tether serve`` as a real process over real HTTP, on both backends: a run is started
over the API, carried by the in-process worker to its suspension, announced on the
webhook, approved over the API and carried on to its answer, each downstream effect once;
SIGTERM then stops the process cleanly (exit 0)."""

from __future__ import annotations

import collections
import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import downstream
import httpx
import processes
import pytest
import webhooks
from waiting import poll_until

from tether.store import Store
from tether.store.users import add_user

STOP_DEADLINE_S = 30


@dataclass
class Service:
    proc: processes.Process
    base: str
    log: Path

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(service: Service) -> bool:
    if service.proc.poll() is not None:
        raise AssertionError(f"serve exited with {service.proc.returncode}:\n{service.logs()}")
    try:
        return httpx.get(f"{service.base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serving(url: str, log: Path, **env: str) -> Iterator[Service]:
    """``tether serve`` with one worker and the test agent, ready to take requests."""
    port = free_port()
    env = processes.tether_env(url, **env)
    proc = processes.spawn("serve", "--port", str(port), "--workers", "1", env=env, log=log)
    service = Service(proc=proc, base=f"http://127.0.0.1:{port}", log=log)
    try:
        poll_until(lambda: _ready(service), timeout=30, what="serve to be ready")
        yield service
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_DEADLINE_S)


def stop(service: Service) -> int:
    """SIGTERM, then the exit code within the deadline."""
    service.proc.send_signal(signal.SIGTERM)
    try:
        return service.proc.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve did not stop within {STOP_DEADLINE_S}s of SIGTERM:\n{service.logs()}")


def new_key(url: str, user: str) -> str:
    store = Store(url)
    try:
        return add_user(store, user)
    finally:
        store.close()


def get_run(client: httpx.Client, run_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_run_is_suspended_announced_approved_and_answered_over_http_then_serve_stops_on_sigterm(
    db_url: str, tmp_path: Path
) -> None:
    key = new_key(db_url, "dana")
    with (
        webhooks.receiver() as receiver,
        serving(
            db_url, tmp_path / "serve.log", TETHER_WEBHOOK_URL=receiver.url, KIT_SCRIPT="standard"
        ) as service,
        httpx.Client(
            base_url=service.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as client,
    ):
        response = client.post("/v1/runs", json={"question": "record a, then send b"})
        assert response.status_code == 202, response.text
        run_id = response.json()["id"]

        poll_until(
            lambda: any(n["run_id"] == run_id for n in receiver.notices),
            what="the suspension notice on the webhook",
        )
        notice = next(n for n in receiver.notices if n["run_id"] == run_id)
        token = notice["token"]
        assert notice["tool"] == "send" and notice["preview"] == {"item": "b", "price": "100"}
        assert notice["approve_url"] == f"{service.base}/approve/{token}"
        run = get_run(client, run_id)
        assert run["state"] == "suspended"
        assert run["pending"]["preview"] == notice["preview"]
        assert run["pending"]["expires_at"] == notice["expires_at"]

        # Mail scanners open links: a GET of the approval page must not use the token.
        page = httpx.get(notice["approve_url"], timeout=10)
        assert page.status_code < 500, page.text[:500]
        assert get_run(client, run_id)["state"] == "suspended"

        response = client.post(f"/v1/approvals/{token}", json={"decision": "approve"})
        assert response.status_code == 200, response.text
        assert response.json()["outcome"] == "executed"

        done = poll_until(
            lambda: (r := get_run(client, run_id))["state"] == "answered" and r,
            what="the run to be answered",
        )
        assert done["messages"][-1] == {"role": "assistant", "content": "done"}
        assert done["budget"]["consumed"]["tool_calls"] == 4  # lookup, record, lookup, send

        effects = downstream.effects()
        assert collections.Counter(tool for _, tool, _ in effects) == {"record": 1, "send": 1}
        assert all(k.startswith(f"{run_id}:") for k, _, _ in effects)
        assert len({k for k, _, _ in effects}) == len(effects)
        repeat = client.post(f"/v1/approvals/{token}", json={"decision": "approve"})
        assert repeat.status_code == 409 and repeat.json()["error"] == "already_resumed"

        kinds = [e["kind"] for e in client.get(f"/v1/runs/{run_id}/events").json()["items"]]
        assert kinds[0] == "created" and kinds[-1] == "answered" and "suspended" in kinds
        metrics = httpx.get(f"{service.base}/metrics", timeout=10).text
        assert 'tether_runs{state="answered"} 1.0' in metrics

        assert stop(service) == 0, service.logs()
    lines = [line for line in service.log.read_text().splitlines() if line.strip()]
    assert lines and all(json.loads(line)["level"] for line in lines), "logs are JSON lines"
    assert not any(json.loads(line)["level"] == "error" for line in lines), service.logs()


@pytest.mark.parametrize("empty_url", ["sqlite", "postgresql"], indirect=True)
def test_serve_migrates_an_empty_database_and_takes_runs(empty_url: str, tmp_path: Path) -> None:
    with serving(empty_url, tmp_path / "serve.log", KIT_SCRIPT="answer") as service:
        key = new_key(empty_url, "dana")
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=service.base, headers=headers, timeout=30) as client:
            response = client.post("/v1/runs", json={"question": "what is six times seven?"})
            assert response.status_code == 202, response.text
            run_id = response.json()["id"]
            done = poll_until(
                lambda: (r := get_run(client, run_id))["state"] == "answered" and r,
                what="the run to be answered",
            )
            assert done["messages"][-1]["content"] == "forty-two"
        assert stop(service) == 0, service.logs()
