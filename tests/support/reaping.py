"""A reaper at work in a real ``tether worker`` process with ``TETHER_REAPER_INTERVAL_S=1``,
for its acceptance test (what it does) and its benchmark (how its passes are spaced).

Orphans are left by ``tether worker`` processes killed at a failpoint; a suspension's notice
is refused by its webhook, so it is due for re-issue on every pass. A second worker with a
one-second interval then recovers the orphans and re-issues the notice; each re-issue is
one pass of its notices task. The worker has one slot: one reaper pass recovers all the
orphans through it, one after another (a pass goes on claiming into its slots until no
orphan is left)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import downstream
import inprocess
import processes
from waiting import poll_until, run_sync

from tether import Engine, StopKind
from tether.notify import Notice
from tether.results import LiveEvent

ORPHANS = 4
REISSUES = 5


class Refusing:
    """A notifier that never delivers (the first notice of the suspension is lost)."""

    async def send(self, notice: Notice) -> bool:
        return False


class RefusingHook:
    """A webhook that answers every notice at once with 410, so it is never delivered."""

    def __init__(self) -> None:
        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.posts += 1
                self.send_response(410)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@dataclass(frozen=True)
class Reaped:
    """What the one-second worker did, read from the runs' events and the webhook."""

    recoveries: list[float]  # each orphan's ``recovering`` event, by the database's clock
    reissues: list[float]  # each ``notice_reissued`` event of the suspended run, in order
    posts: int  # the notices the webhook received (and refused)
    records: list[str]  # the idempotency keys of the orphans' writes, one per effect
    suspended_state: str  # the suspended run's state at the end


def events(engine: Engine, run_id: str, kind: str) -> list[LiveEvent]:
    return [e for e in run_sync(engine.events(run_id)) if e.kind == kind]


def state(engine: Engine, run_id: str) -> str:
    run = run_sync(engine.get_run(run_id)).run
    return run.state.value if run is not None else "missing"


def leave_orphans(url: str, engine: Engine) -> list[str]:
    """Runs left running by workers killed (``os._exit``) after a write committed."""
    ids = [run_sync(engine.start_run("dana", f"job {i}")).id for i in range(ORPHANS)]
    env = processes.tether_env(
        url, KIT_SCRIPT="work", TETHER_FAILPOINTS="after_tool_commit:record=crash"
    )
    for _ in ids:  # one slot each: each process takes one run with it
        crashed = processes.tether("worker", "--concurrency", "1", "--no-reap", env=env)
        assert crashed.returncode == 137, crashed.stderr[-2000:]
    for run_id in ids:
        run = run_sync(engine.get_run(run_id)).run
        assert run is not None and run.state.value == "running" and run.owner is not None
    return ids


def reap_with_a_one_second_interval(url: str, log: Path) -> Reaped:
    """Leave the orphans and the refused notice, run the one-second worker until it has
    recovered every orphan and re-issued the notice ``REISSUES`` times, stop it (SIGTERM,
    exit 0) and read what it did."""
    engine = inprocess.engine(url, script_name="work")
    setup = inprocess.engine(url, script_name="send", notifier=Refusing())
    hook = RefusingHook()
    worker = None
    try:
        suspended = run_sync(setup.ask("dana", "send"))
        assert suspended.kind is StopKind.SUSPENDED
        orphans = leave_orphans(url, engine)
        env = processes.tether_env(
            url,
            KIT_SCRIPT="work",
            TETHER_REAPER_INTERVAL_S="1",
            TETHER_HEARTBEAT_TIMEOUT_S="0.5",
            TETHER_NOTICE_TIMEOUT_S="0.5",  # the refused notice is due again at each pass
            TETHER_WEBHOOK_URL=hook.url,
        )
        worker = processes.spawn("worker", "--concurrency", "1", env=env, log=log)
        poll_until(
            lambda: all(state(engine, i) == "answered" for i in orphans)
            and len(events(engine, suspended.run_id, "notice_reissued")) >= REISSUES,
            timeout=120,
            what="orphans recovered and the notice re-issued",
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
        return Reaped(
            recoveries=sorted(e.at for i in orphans for e in events(engine, i, "recovering")),
            reissues=sorted(e.at for e in events(engine, suspended.run_id, "notice_reissued")),
            posts=hook.posts,
            records=[key for key, tool, _ in downstream.effects() if tool == "record"],
            suspended_state=state(engine, suspended.run_id),
        )
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        hook.close()
        setup.close()
        engine.close()
