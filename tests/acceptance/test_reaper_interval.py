"""``TETHER_REAPER_INTERVAL_S=1`` is honoured on both backends, with real processes.

Orphans are left by ``tether worker`` processes killed at a failpoint; a suspension's notice
is refused by its webhook, so it is due for re-issue on every pass. A second worker with a
one-second interval then recovers the orphans and re-issues the notice.

What is asserted, and why it is robust: each re-issue of the notice is one pass of the
notices task. Under a 5 s floor (the old PostgreSQL worker, which checked the reaper only
after a 5 s idle wait) five passes span at least 20 s of the database clock, whatever the
load. With a 1 s interval they span about 4 s, so the assertion leaves a factor of four to
a loaded machine before it could fail spuriously, and a floor fails it every time. The
recovering worker has one slot; one reaper pass recovers all four orphans through it, one
after another (a pass goes on claiming into its slots until no orphan is left), so their
recoveries span well under the three passes' worth they are allowed.
"""

from __future__ import annotations

import signal
import threading
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

FLOOR_S = 5.0  # the interval a broken worker would fall back to
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


def _events(engine: Engine, run_id: str, kind: str) -> list[LiveEvent]:
    return [e for e in run_sync(engine.events(run_id)) if e.kind == kind]


def _state(engine: Engine, run_id: str) -> str:
    run = run_sync(engine.get_run(run_id)).run
    return run.state.value if run is not None else "missing"


def _leave_orphans(url: str, engine: Engine) -> list[str]:
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


def test_a_one_second_reaper_interval_is_honoured(db_url: str, tmp_path: Path) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    setup = inprocess.engine(db_url, script_name="send", notifier=Refusing())
    hook = RefusingHook()
    worker = None
    try:
        suspended = run_sync(setup.ask("dana", "send"))
        assert suspended.kind is StopKind.SUSPENDED
        orphans = _leave_orphans(db_url, engine)
        env = processes.tether_env(
            db_url,
            KIT_SCRIPT="work",
            TETHER_REAPER_INTERVAL_S="1",
            TETHER_HEARTBEAT_TIMEOUT_S="0.5",
            TETHER_NOTICE_TIMEOUT_S="0.5",  # the refused notice is due again at each pass
            TETHER_WEBHOOK_URL=hook.url,
        )
        log = tmp_path / "reaper.log"
        worker = processes.spawn("worker", "--concurrency", "1", env=env, log=log)
        poll_until(
            lambda: all(_state(engine, i) == "answered" for i in orphans)
            and len(_events(engine, suspended.run_id, "notice_reissued")) >= REISSUES,
            timeout=120,
            what="orphans recovered and the notice re-issued",
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
        recoveries = sorted(e.at for i in orphans for e in _events(engine, i, "recovering"))
        reissues = sorted(e.at for e in _events(engine, suspended.run_id, "notice_reissued"))
        assert len(recoveries) == ORPHANS  # one pass each, none recovered twice
        span = recoveries[-1] - recoveries[0]
        assert span < (ORPHANS - 1) * FLOOR_S, f"{ORPHANS} recoveries took {span:.1f}s"
        span = reissues[REISSUES - 1] - reissues[0]
        assert span < (REISSUES - 1) * FLOOR_S, f"{REISSUES} re-issues took {span:.1f}s"
        # Each re-issue was really sent and refused (SIGTERM may cut the last one short).
        assert hook.posts >= REISSUES - 1
        records = [key for key, tool, _ in downstream.effects() if tool == "record"]
        assert len(records) == len(set(records)) == ORPHANS  # each write applied once
        assert _state(engine, suspended.run_id) == "suspended"
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        hook.close()
        setup.close()
        engine.close()
