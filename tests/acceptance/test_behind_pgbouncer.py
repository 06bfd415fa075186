"""``tether serve`` and ``tether worker`` as real processes behind a real PgBouncer in
transaction mode (``tests/support/pgbouncer.py``), as docs/operations.md ("Behind
PgBouncer") tells a team to run them: ``TETHER_DATABASE_URL`` the pooler's with
``?pool_mode=transaction``, ``TETHER_LISTEN_DATABASE_URL`` direct. Their transactions go
through the pooler and only their LISTEN sessions go direct; a run is carried, streamed
live across processes (events and the model's text), approved over HTTP and answered; an
idle worker picks up a run created after it went idle; ``tether migrate`` builds an empty
database through the pooler. PostgreSQL only: SQLite has no pooler."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import agents
import httpx
import processes
import psycopg
import pytest
import webhooks
from httpx_sse import connect_sse
from pgbouncer import Bouncer, pgbouncer
from pgcluster import free_port
from waiting import poll_until

from tether.store import SchemaStatus, Store, schema_status
from tether.store.users import add_user

DEADLINE_S = 60.0
STOP_DEADLINE_S = 30
# The first turn's text, streamed a few letters every 0.1 s (about 3 s in all): long
# enough for the watcher's process to ask the worker's for it mid-step.
SCRIPT = "streamed_send"
TEXT = agents.SCRIPTS[SCRIPT][0]["content"]
# The statements a process's LISTEN connection runs (its channels change as the claim loop,
# the live streams and the deltas come and go).
LISTENING = ("LISTEN ", "UNLISTEN ")


@contextmanager
def running(proc: processes.Process) -> Iterator[processes.Process]:
    """``proc`` until the block ends; killed then if the test did not stop it."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_DEADLINE_S)


def _stop(proc: processes.Process, log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=STOP_DEADLINE_S) == 0, log.read_text()[-3000:]
    levels = [json.loads(line)["level"] for line in log.read_text().splitlines() if line.strip()]
    assert "error" not in levels, log.read_text()[-3000:]


def _direct_sessions(bouncer: Bouncer) -> list[str]:
    """The last statement of every session of the database that did not come through the
    pooler (this one aside)."""
    with psycopg.connect(bouncer.direct_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, query FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    servers = bouncer.server_pids()  # after: a server connection seen above is still listed
    return [query for pid, query in rows if pid not in servers]


def _one_listening(sessions: list[str]) -> bool:
    return len(sessions) == 1 and sessions[0].startswith(LISTENING)


class Stream:
    """A run's live events and deltas over HTTP (``?deltas=1``), read in a thread until the
    server ends the stream (the run is terminal)."""

    def __init__(self, base: str, key: str, run_id: str) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self._url = f"{base}/v1/runs/{run_id}/events/stream?deltas=1"
        self._headers = {"Authorization": f"Bearer {key}"}
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        with (
            httpx.Client(timeout=DEADLINE_S) as client,
            connect_sse(client, "GET", self._url, headers=self._headers) as source,
        ):
            for sse in source.iter_sse():
                self.items.append((sse.event, json.loads(sse.data)))

    def start(self) -> Stream:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(timeout=DEADLINE_S)
        assert not self._thread.is_alive(), f"the stream did not end: {self.kinds()}"

    def kinds(self) -> list[str]:
        return [event for event, _ in self.items if event != "delta"]

    def text_of_step(self, step: int) -> str:
        """The step's text as a client rebuilds it from the deltas (reference §16: offset 0
        starts it again, every other delta follows on without gap)."""
        text = ""
        for event, data in self.items:
            if event == "delta" and data["step"] == step:
                assert data["offset"] in (0, len(text)), (data, text)
                text = data["text"] if data["offset"] == 0 else text + data["text"]
        return text


def _state(client: httpx.Client, run_id: str) -> str:
    response = client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    return str(response.json()["state"])


def test_serve_and_a_worker_behind_pgbouncer_carry_stream_approve_and_wake_on_new_runs(
    pg_url: str, tmp_path: Path
) -> None:
    store = Store(pg_url)
    try:
        key = add_user(store, "dana")
    finally:
        store.close()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (
        pgbouncer(pg_url) as bouncer,
        webhooks.receiver() as receiver,
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as client,
    ):
        env = processes.tether_env(
            bouncer.tether_url,
            TETHER_LISTEN_DATABASE_URL=pg_url,
            TETHER_WEBHOOK_URL=receiver.url,
            KIT_SCRIPT=SCRIPT,
            KIT_STREAM_DELAY_S="0.1",
        )
        serve_log, worker_log = tmp_path / "serve.log", tmp_path / "worker.log"
        # The API alone: the runs are carried by the worker, another process.
        serve = processes.spawn(
            "serve", "--port", str(port), "--workers", "0", env=env, log=serve_log
        )
        with running(serve):
            poll_until(
                lambda: processes.serve_ready(serve, base, serve_log),
                timeout=DEADLINE_S,
                what="serve",
            )
            created = client.post("/v1/runs", json={"question": "send b"})
            assert created.status_code == 202, created.text
            first = created.json()["id"]
            # Watched before any worker runs, so its text is asked for while it is written.
            stream = Stream(base, key, first).start()
            poll_until(lambda: stream.kinds()[:1] == ["created"], what="the stream to start")

            worker = processes.spawn("worker", "--no-reap", env=env, log=worker_log)
            with running(worker):
                token = poll_until(
                    lambda: next(
                        (n["token"] for n in receiver.notices if n["run_id"] == first), None
                    ),
                    timeout=DEADLINE_S,
                    what="the suspension's notice",
                )
                approved = client.post(f"/v1/approvals/{token}", json={"decision": "approve"})
                assert approved.status_code == 200, approved.text
                assert approved.json()["outcome"] == "executed"
                stream.join()
                assert _state(client, first) == "answered"
                kinds = stream.kinds()
                assert kinds[0] == "created" and kinds[-1] == "answered", kinds
                assert kinds.index("suspended") < kinds.index("approved"), kinds
                # The text came from the worker's process, through NOTIFY and LISTEN
                # (its end may come with the stored turn, which holds it all).
                streamed = stream.text_of_step(1)
                assert streamed and TEXT.startswith(streamed), streamed

                # The worker is idle now, listening on its process's one session (the API's
                # closed once its stream ended); a run created now is claimed by it and
                # carried to its suspension.
                poll_until(
                    lambda: _one_listening(_direct_sessions(bouncer)),
                    what="the worker's LISTEN alone",
                )
                created = client.post("/v1/runs", json={"question": "send b again"})
                assert created.status_code == 202, created.text
                second = created.json()["id"]
                poll_until(
                    lambda: _state(client, second) == "suspended",
                    timeout=DEADLINE_S,
                    what="the idle worker to carry the new run",
                )
                pending = client.get(f"/v1/runs/{second}").json()["pending_calls"]
                decided = client.post(
                    f"/v1/runs/{second}/decisions",
                    json={
                        "decisions": [
                            {"tool_call_id": pending[0]["tool_call_id"], "decision": "approve"}
                        ]
                    },
                )
                assert decided.status_code == 200, decided.text
                assert decided.json()["results"][0]["outcome"] == "executed"
                poll_until(
                    lambda: _state(client, second) == "answered",
                    timeout=DEADLINE_S,
                    what="the second run's answer",
                )

                # Everything but the LISTEN sessions went through the pooler.
                direct = _direct_sessions(bouncer)
                assert direct and all(q == "" or q.startswith(LISTENING) for q in direct), direct
                assert bouncer.transactions() > 0
                _stop(worker, worker_log)
            _stop(serve, serve_log)
        assert "ERROR" not in bouncer.log_tail(100_000), bouncer.log_tail()


@pytest.mark.parametrize("empty_url", ["postgresql"], indirect=True)
def test_tether_migrate_through_pgbouncer_builds_an_empty_database(
    empty_url: str, tmp_path: Path
) -> None:
    with pgbouncer(empty_url) as bouncer:
        env = processes.tether_env(bouncer.tether_url, TETHER_LISTEN_DATABASE_URL=empty_url)
        done = processes.tether("migrate", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert bouncer.transactions() > 0
    store = Store(empty_url)
    try:
        assert schema_status(store.engine) is SchemaStatus.CURRENT
    finally:
        store.close()
