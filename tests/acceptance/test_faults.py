"""Fault trials, black-box, with real processes: the database drops every connection, is
restarted, is locked by another process or runs out of disk; a webhook hangs; an
approval storm meets a short heartbeat; a plain-function tool outlasts the heartbeat
timeout. In each, no run fails with ``fail_reason = "error"``, every run reaches the
state its script leads to, no process exits, and the API answers no 500.

The runs are the test agent's (``agents:fault_agent``): each question names its script
(``script:steps``: six short naps, a write, the answer; ``script:send``: a send that
needs confirmation; ``script:careful_send``: one whose re-check after approval is slow;
``script:slow``: a six-second plain-function read). Timings are chosen for a loaded
two-core machine: every wait is a poll with a deadline, and the only sleeps are the
faults' own durations.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import downstream
import httpx
import inprocess
import pgcluster
import processes
import psycopg
import pytest
import webhooks
from waiting import poll_until, run_sync

from tether import Engine
from tether.store import Store, upgrade
from tether.store.users import add_user

AGENT = "agents:fault_agent"
TERMINATE = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE datname = %s AND pid <> pg_backend_pid()"
)
# Short enough that an abandoned run is recovered within the test, long enough that a
# loaded machine does not take a live run for an orphan (the heartbeat beats at 1/3).
FAULT_ENV = {
    "TETHER_HEARTBEAT_TIMEOUT_S": "2",
    "TETHER_REAPER_INTERVAL_S": "1",
    # The trials are about surviving faults, not about the recovery budget: a run taken
    # for an orphan several times must not be failed ``recovery_exhausted``.
    "TETHER_MAX_RECOVERY_ATTEMPTS": "50",
}


# -- processes -------------------------------------------------------------------------------


class Procs:
    """The processes a test started, with their logs; all stopped on exit (SIGTERM, then
    SIGKILL after a deadline), whatever happened."""

    def __init__(self) -> None:
        self.started: list[tuple[processes.Process, Path]] = []

    def add(self, proc: processes.Process, log: Path) -> processes.Process:
        self.started.append((proc, log))
        return proc

    def worker(self, env: dict[str, str], log: Path, *args: str) -> processes.Process:
        return self.add(processes.spawn_agent("worker", *args, agent=AGENT, env=env, log=log), log)

    def serve(self, env: dict[str, str], log: Path, *, concurrency: int = 8) -> str:
        """``tether serve --workers 1``; its base URL once /readyz answers 200."""
        port = pgcluster.free_port()
        proc = self.add(
            processes.spawn_agent(
                "serve", "--port", str(port), "--workers", "1",
                "--concurrency", str(concurrency), agent=AGENT, env=env, log=log,
            ),
            log,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"

        poll_until(
            lambda: processes.serve_ready(proc, base, log),
            timeout=60,
            interval=0.2,
            what="serve to be ready",
        )
        return base

    def assert_alive(self) -> None:
        dead = [
            f"{log.name} exited with {proc.returncode}:\n{tail(log)}"
            for proc, log in self.started
            if proc.poll() is not None
        ]
        assert not dead, "\n\n".join(dead)

    def logs(self) -> str:
        return "\n".join(log.read_text(errors="replace") for _, log in self.started)

    def status(self) -> str:
        """Which processes are alive, and how the others exited."""
        return ", ".join(
            f"{log.stem}: {'alive' if proc.poll() is None else f'exited {proc.returncode}'}"
            for proc, log in self.started
        )

    def __enter__(self) -> Procs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


# -- the API ---------------------------------------------------------------------------------


def new_key(url: str, user: str = "dana") -> str:
    store = Store(url)
    try:
        return add_user(store, user)
    finally:
        store.close()


@contextmanager
def api(base: str, key: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        yield client


def start_runs(client: httpx.Client, questions: list[str]) -> list[str]:
    ids = []
    for question in questions:
        response = client.post("/v1/runs", json={"question": question})
        assert response.status_code == 202, response.text
        ids.append(str(response.json()["id"]))
    return ids


def runs_now(client: httpx.Client, ids: list[str]) -> dict[str, dict[str, Any]] | None:
    """Every run as the API shows it now; None if any answer was not a 200."""
    found: dict[str, dict[str, Any]] = {}
    for run_id in ids:
        try:
            response = client.get(f"/v1/runs/{run_id}")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        found[run_id] = response.json()
    return found


def summary(runs: dict[str, dict[str, Any]] | None) -> str:
    if runs is None:
        return "(the API did not answer)"
    counts = collections.Counter(
        (r["state"], r["fail_reason"] or r["halt_reason"] or "") for r in runs.values()
    )
    return ", ".join(
        f"{state}{'/' + why if why else ''}: {n}" for (state, why), n in counts.items()
    )


def wait_for_states(
    client: httpx.Client, ids: list[str], wanted: str, *, timeout: float, procs: Procs
) -> dict[str, dict[str, Any]]:
    """Poll until every run is in ``wanted``; a run in another state it cannot leave, or
    the deadline, fails with what each run shows."""
    last: list[dict[str, dict[str, Any]] | None] = [None]

    def settled() -> dict[str, dict[str, Any]] | None:
        runs = runs_now(client, ids)
        if runs is None:
            return None
        last[0] = runs
        stuck = [r for r in runs.values() if r["state"] in ("failed", "cancelled", "halted")]
        assert not stuck, f"runs ended wrongly: {summary(runs)}\n{procs.logs()[-4000:]}"
        return runs if all(r["state"] == wanted for r in runs.values()) else None

    try:
        found: dict[str, dict[str, Any]] = poll_until(
            settled, timeout=timeout, interval=0.25, what=f"every run to be {wanted}"
        )
    except AssertionError as exc:
        if "timed out" not in str(exc):
            raise
        raise AssertionError(
            f"not every run reached {wanted} within {timeout}s: {summary(last[0])}\n"
            f"processes: {procs.status()}\n{procs.logs()[-6000:]}"
        ) from exc
    return found


def steps_taken(client: httpx.Client, ids: list[str]) -> int:
    runs = runs_now(client, ids)
    return max((r["budget"]["consumed"]["steps"] for r in runs.values()), default=0) if runs else 0


class ApiWatch:
    """From a thread, until stopped: GET every run and /readyz over and over, keeping the
    status of each answer; any 5xx other than 503 ``database_unavailable`` (a run) or 503
    ``not_ready`` (/readyz), and any request that got no answer, is a complaint."""

    def __init__(self, base: str, key: str, ids: list[str]) -> None:
        self.base = base
        self.key = key
        self.ids = ids
        self.answers: collections.Counter[tuple[str, int]] = collections.Counter()
        self.complaints: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="api-watch", daemon=True)

    def __enter__(self) -> ApiWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _poll(self) -> None:
        with api(self.base, self.key) as client:
            while not self._stop.is_set():
                for i, run_id in enumerate(self.ids):
                    self._get(client, f"/v1/runs/{run_id}", "run", "database_unavailable")
                    if i % 4 == 0:
                        self._get(client, "/readyz", "readyz", "not_ready")
                self._stop.wait(0.05)  # pacing, not synchronisation

    def _get(self, client: httpx.Client, path: str, kind: str, allowed_503: str) -> None:
        try:
            response = client.get(path)
        except httpx.HTTPError as exc:
            self.complaints.append(f"GET {path}: no answer ({type(exc).__name__}: {exc})")
            return
        self.answers[(kind, response.status_code)] += 1
        if response.status_code == 200:
            return
        try:
            error = response.json().get("error")
        except ValueError:
            error = None
        if response.status_code != 503 or error != allowed_503:
            self.complaints.append(f"GET {path}: {response.status_code} {response.text[:300]}")


# -- 1. dropped connections ------------------------------------------------------------------


def drop_connections(url: str, *, seconds: float, every: float) -> int:
    """For ``seconds``, every ``every`` seconds, terminate every other backend connected to
    ``url``'s database; how many were terminated."""
    dbname = url.rsplit("/", 1)[1]
    killed = 0
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            killed += sum(1 for (ok,) in conn.execute(TERMINATE, (dbname,)).fetchall() if ok)
            time.sleep(every)  # the fault's rhythm
    return killed


def test_dropped_connections_fail_no_run_and_stop_no_process(pg_url: str, tmp_path: Path) -> None:
    key = new_key(pg_url)
    env = processes.tether_env(pg_url, **FAULT_ENV)
    with Procs() as procs:
        base = procs.serve(env, tmp_path / "serve.log", concurrency=2)
        for i in range(2):
            procs.worker(env, tmp_path / f"worker{i}.log", "--concurrency", "2")
        with api(base, key) as client:
            ids = start_runs(client, [f"script:steps job {i}" for i in range(15)])
            poll_until(lambda: steps_taken(client, ids) >= 2, timeout=60, what="runs under way")
            with ApiWatch(base, key, ids) as watch:
                killed = drop_connections(pg_url, seconds=8, every=0.5)
                procs.assert_alive()
                wait_for_states(client, ids, "answered", timeout=90, procs=procs)
            procs.assert_alive()
    assert killed > 0, "the trial dropped no connection"
    assert not watch.complaints, "\n".join(watch.complaints[:20])
    assert watch.answers[("run", 200)] > 0 and watch.answers[("readyz", 200)] > 0
    records = [key for key, tool, _ in downstream.effects() if tool == "record"]
    assert sorted(records) == sorted(set(records)) and len(records) == len(ids)


# -- 2. the database restarts ----------------------------------------------------------------


DOWN_S = 3.0


def test_a_database_restart_fails_no_run_and_stops_no_process(tmp_path: Path) -> None:
    with pgcluster.pg_cluster() as cluster, Procs() as procs:
        store = Store(cluster.url)
        try:
            upgrade(store.engine)
        finally:
            store.close()
        key = new_key(cluster.url)
        env = processes.tether_env(cluster.url, **FAULT_ENV)
        base = procs.serve(env, tmp_path / "serve.log", concurrency=2)
        procs.worker(env, tmp_path / "worker.log", "--concurrency", "3")
        with api(base, key) as client:
            ids = start_runs(client, [f"script:steps job {i}" for i in range(10)])
            poll_until(lambda: steps_taken(client, ids) >= 2, timeout=60, what="runs under way")
            with ApiWatch(base, key, ids) as watch:
                cluster.stop("fast")
                down = readyz_while(base, DOWN_S)
                cluster.start()
                procs.assert_alive()
                poll_until(
                    lambda: _readyz(base) == 200, timeout=60, what="/readyz 200 after restart"
                )
                wait_for_states(client, ids, "answered", timeout=90, procs=procs)
            procs.assert_alive()
    assert 503 in down, f"/readyz while the database was down: {down}"
    assert not watch.complaints, "\n".join(watch.complaints[:20])


def _readyz(base: str) -> int | str:
    try:
        return httpx.get(f"{base}/readyz", timeout=10).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def readyz_while(base: str, seconds: float) -> list[int | str]:
    """/readyz's answers for ``seconds`` (the database stays down that long), and then
    until one is a 503 (for up to 30 s more), so a slow machine cannot miss it."""
    started = time.monotonic()
    seen: list[int | str] = []
    while True:
        elapsed = time.monotonic() - started
        if elapsed >= seconds and (503 in seen or elapsed >= seconds + 30):
            return seen
        seen.append(_readyz(base))
        time.sleep(0.2)  # pacing while the fault lasts


# -- 3. a webhook that never answers ---------------------------------------------------------


class HungHook:
    """A webhook that accepts TCP connections and then never reads nor answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="hung-hook", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for conn in self.accepted:
            conn.close()
        self.listener.close()


def test_a_hung_webhook_delays_no_run(sqlite_url: str, tmp_path: Path) -> None:
    """Ten runs suspend (each sends a notice to a webhook that hangs: 4 attempts of 5 s
    each) and ten need no notice, in one worker with four slots. Notices off the path:
    all twenty are where their script leads within 20 s. Notices on the path: the four
    slots are held by hung notices for 20 s at a time, so the plain runs (queued behind
    the suspending ones) cannot finish within 40 s."""
    hook = HungHook()
    engine = inprocess.fault_engine(sqlite_url)
    try:
        suspending = [run_sync(engine.start_run("dana", f"script:send {i}")).id for i in range(10)]
        plain = [run_sync(engine.start_run("dana", f"script:work {i}")).id for i in range(10)]
        env = processes.tether_env(
            sqlite_url,
            TETHER_WEBHOOK_URL=hook.url,
            TETHER_HEARTBEAT_TIMEOUT_S="5",
            TETHER_REAPER_INTERVAL_S="3600",
        )
        with Procs() as procs:
            procs.worker(env, tmp_path / "worker.log", "--concurrency", "4")

            def where() -> dict[str, int]:
                runs = [run_sync(engine.get_run(i)).run for i in suspending + plain]
                return dict(collections.Counter(r.state.value for r in runs if r is not None))

            expected = {"suspended": len(suspending), "answered": len(plain)}
            try:
                poll_until(lambda: where() == expected, timeout=20, interval=0.2)
            except AssertionError as exc:
                raise AssertionError(
                    f"within 20 s: {where()}, expected {expected}\n{procs.logs()[-3000:]}"
                ) from exc
            for run_id in plain:
                run = run_sync(engine.get_run(run_id)).run
                assert run is not None and run.state.value == "answered"
            poll_until(lambda: hook.accepted, timeout=30, what="a notice to reach the hook")
            procs.assert_alive()
    finally:
        engine.close()
        hook.close()


# -- 4. an approval storm --------------------------------------------------------------------


def test_an_approval_storm_resumes_each_run_once_without_losing_a_lease(
    pg_url: str, tmp_path: Path
) -> None:
    """Twenty suspended runs, ten concurrent approvers per token."""
    approval_storm(pg_url, tmp_path, tool="send", runs=20, approvers=10)


def test_approvals_whose_rechecks_outlast_the_heartbeat_timeout_keep_their_lease(
    pg_url: str, tmp_path: Path
) -> None:
    """The approved call's guard takes 5 s (2.5 heartbeat timeouts) before the tool runs:
    the request executing the approval holds the run's lease, and its heartbeat must
    keep it, or the reaper takes the run for an orphan mid-approval."""
    downstream.set_world("careful_guard_ms", "5000")
    approval_storm(pg_url, tmp_path, tool="careful_send", runs=5, approvers=3)


def approval_storm(pg_url: str, tmp_path: Path, *, tool: str, runs: int, approvers: int) -> None:
    """``runs`` runs suspended on ``tool`` under ``tether serve`` (heartbeat timeout 2 s,
    reaper every second), then ``approvers`` concurrent approvals of each token: exactly
    one executes, the others are ``already_resumed``; no 500, no lease lost, no run taken
    for an orphan; every run is then answered, its write applied once."""
    key = new_key(pg_url)
    with webhooks.receiver() as receiver, Procs() as procs:
        env = processes.tether_env(pg_url, **FAULT_ENV, TETHER_WEBHOOK_URL=receiver.url)
        base = procs.serve(env, tmp_path / "serve.log")
        with api(base, key) as client:
            ids = start_runs(client, [f"script:{tool} storm {i}" for i in range(runs)])
            poll_until(
                lambda: {n["run_id"] for n in receiver.notices} >= set(ids),
                timeout=60,
                what="every run's notice",
            )
            wait_for_states(client, ids, "suspended", timeout=30, procs=procs)
            tokens = {run_id: receiver.token_for(run_id) for run_id in ids}

            requests = [(run_id, tokens[run_id]) for run_id in ids for _ in range(approvers)]
            start = threading.Barrier(len(requests))

            # Each approver is its own client on its own connection, as separate people
            # are. One shared client's pool handed a thread that the barrier released
            # late a connection another had left idle, just as the server closed it for
            # idleness (uvicorn's keep-alive timeout): a race of HTTP/1.1 clients, not
            # of tether, seen as "connection reset" under load.
            def approve(token: str) -> tuple[int, dict[str, Any]]:
                with httpx.Client(
                    base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120
                ) as approver:
                    start.wait(timeout=60)
                    response = approver.post(f"/v1/approvals/{token}", json={"decision": "approve"})
                try:
                    body = response.json()
                except ValueError:
                    body = {"text": response.text[:300]}
                return response.status_code, body

            with ThreadPoolExecutor(max_workers=len(requests)) as pool:
                answers = list(pool.map(lambda r: approve(r[1]), requests))

            by_run: dict[str, list[tuple[int, dict[str, Any]]]] = collections.defaultdict(list)
            for (run_id, _), answer in zip(requests, answers, strict=True):
                by_run[run_id].append(answer)
            dump = json.dumps(answers)[:3000]
            assert not [a for a in answers if a[0] >= 500], dump
            assert "lease_lost" not in dump, dump
            for run_id, got in by_run.items():
                wins = [body for status, body in got if status == 200]
                assert len(wins) == 1, (run_id, got)
                assert wins[0]["ok"] is True and wins[0]["outcome"] == "executed", wins
                losses = [(s, b.get("error")) for s, b in got if s != 200]
                assert losses == [(409, "already_resumed")] * (approvers - 1), (run_id, got)

            wait_for_states(client, ids, "answered", timeout=60, procs=procs)
            for run_id in ids:
                response = client.get(f"/v1/runs/{run_id}/events")
                kinds = [e["kind"] for e in response.json()["items"]]
                assert "recovering" not in kinds, (run_id, kinds)
            procs.assert_alive()
        logs = procs.logs()
    assert "lease_lost" not in logs and "lease lost" not in logs, logs[-4000:]
    sent = collections.Counter(key for key, name, _ in downstream.effects() if name == tool)
    assert len(sent) == len(ids) and set(sent.values()) == {1}, sent


# -- 5. SQLite: a locked database, a full disk -----------------------------------------------


LOCK_S = 5.0


def _states(engine: Engine, ids: list[str]) -> dict[str, int]:
    runs = [run_sync(engine.get_run(i)).run for i in ids]
    return dict(collections.Counter(r.state.value for r in runs if r is not None))


def _steps(engine: Engine, ids: list[str]) -> int:
    runs = [run_sync(engine.get_run(i)).run for i in ids]
    return max((r.budget.steps for r in runs if r is not None), default=0)


def _all_answered(engine: Engine, ids: list[str], procs: Procs, timeout: float) -> None:
    def done() -> bool:
        states = _states(engine, ids)
        assert not set(states) - {"running", "answered"}, f"{states}\n{procs.logs()[-4000:]}"
        return states == {"answered": len(ids)}

    try:
        poll_until(done, timeout=timeout, interval=0.25)
    except AssertionError as exc:
        if "timed out" not in str(exc):
            raise
        raise AssertionError(
            f"not every run answered within {timeout}s: {_states(engine, ids)}\n"
            f"processes: {procs.status()}\n{procs.logs()[-6000:]}"
        ) from exc


def test_a_locked_sqlite_database_fails_no_run(sqlite_url: str, tmp_path: Path) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    engine = inprocess.fault_engine(sqlite_url)
    try:
        ids = [run_sync(engine.start_run("dana", f"script:steps job {i}")).id for i in range(10)]
        env = processes.tether_env(sqlite_url, **FAULT_ENV)
        with Procs() as procs:
            procs.worker(env, tmp_path / "worker.log", "--concurrency", "4")
            poll_until(lambda: _steps(engine, ids) >= 2, timeout=60, what="runs under way")
            holder = sqlite3.connect(path, isolation_level=None, timeout=30)
            try:
                holder.execute("BEGIN IMMEDIATE")  # another process's write transaction
                time.sleep(LOCK_S)  # the fault's duration
                holder.execute("COMMIT")
            finally:
                holder.close()
            procs.assert_alive()
            _all_answered(engine, ids, procs, timeout=90)
            procs.assert_alive()
    finally:
        engine.close()


FULL_S = 4.0


@contextmanager
def small_tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` at ``where``; skips the test where mounting is not allowed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs a tmpfs mount, which needs root")
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def fill(filler: Path) -> int:
    """Write ``filler`` until the filesystem is full (big blocks, then smaller ones down to
    single bytes, for the last partly used page); the bytes written."""
    written = 0
    with filler.open("wb", buffering=0) as out:
        for size in (1 << 20, 4096, 1):
            block = b"\0" * size
            while True:
                try:
                    written += out.write(block) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return written


def test_a_full_disk_stops_no_sqlite_worker(sqlite_url: str, tmp_path: Path) -> None:
    with ExitStack() as stack:
        disk = stack.enter_context(small_tmpfs(tmp_path / "small", 32))
        shutil.copyfile(sqlite_url.removeprefix("sqlite:///"), disk / "tether.db")
        url = f"sqlite:///{disk / 'tether.db'}"
        engine = inprocess.fault_engine(url)
        stack.callback(engine.close)
        procs = stack.enter_context(Procs())
        ids = [run_sync(engine.start_run("dana", f"script:steps job {i}")).id for i in range(10)]
        env = processes.tether_env(url, **FAULT_ENV)
        procs.worker(env, tmp_path / "worker.log", "--concurrency", "4")
        poll_until(lambda: _steps(engine, ids) >= 2, timeout=60, what="runs under way")
        filler = disk / "filler"
        written = fill(filler)
        try:
            with pytest.raises(OSError) as full:
                (disk / "probe").write_bytes(b"x" * 8192)
            assert full.value.errno == errno.ENOSPC
            time.sleep(FULL_S)  # the fault's duration
        finally:
            filler.unlink()
            (disk / "probe").unlink(missing_ok=True)
        assert written > 0
        procs.assert_alive()
        _all_answered(engine, ids, procs, timeout=90)
        procs.assert_alive()


# -- 6. a plain-function tool longer than the heartbeat timeout ------------------------------


def test_a_slow_plain_function_tool_is_never_taken_for_an_orphan(
    pg_url: str, tmp_path: Path
) -> None:
    """``nap`` sleeps 6 s in a thread; the heartbeat timeout is 1.5 s and both workers
    reap every 0.5 s. Tool threads on the event loop's path would let the lease go stale
    and the other worker recover the run, running the read again."""
    engine = inprocess.fault_engine(pg_url)
    try:
        ids = [run_sync(engine.start_run("dana", f"script:slow {i}")).id for i in range(2)]
        env = processes.tether_env(
            pg_url, TETHER_HEARTBEAT_TIMEOUT_S="1.5", TETHER_REAPER_INTERVAL_S="0.5"
        )
        with Procs() as procs:
            for i in range(2):
                procs.worker(env, tmp_path / f"worker{i}.log", "--concurrency", "2")
            _all_answered(engine, ids, procs, timeout=90)
            procs.assert_alive()
        naps = collections.Counter(key for key, tool, _ in downstream.effects() if tool == "nap")
        assert sorted(k.split(":")[0] for k in naps) == sorted(ids), naps
        assert set(naps.values()) == {1}, f"a read ran again: {naps}"
        for run_id in ids:
            kinds = [e.kind for e in run_sync(engine.events(run_id))]
            assert "recovering" not in kinds, kinds
            run = run_sync(engine.get_run(run_id)).run
            assert run is not None and run.recovery_attempts == 0
    finally:
        engine.close()
