"""Escalations fleet-wide (reference §19), on PostgreSQL and SQLite: ``--calls`` (1,000)
suspended calls whose tool declares ``escalate_after_min`` come due together, and
``--workers`` (3) ``tether worker`` processes race to escalate them. Each call must be
escalated exactly once, and its escalation's notice delivered once.

On a fresh database an in-process engine suspends ``--calls`` runs of
``bench_agent:escalating_agent`` on one ``page`` call each (escalated after 20 minutes:
none comes due by itself). The benchmark then moves every call's due time
(``pending_calls.escalate_at``) to the database's clock plus ``--lead`` seconds, in one
UPDATE, so they come due together, and starts the workers (their notices go to a webhook
in this process); each worker's escalation pass sleeps until the due time by the
database's clock. Once the webhook has every escalation's notice (or after ``--timeout``
seconds) the workers are stopped (SIGTERM) and the database read. On PostgreSQL the
tables are analysed once filled, as autovacuum would have done (``--no-analyze`` leaves
them as filled: the plans of a table nobody analysed yet):

- exactly once: the calls escalated, the ``escalated`` events and the ``escalated``
  audit records per call, and the escalation notices the webhook received per call (each
  must be 1);
- from due to escalated (``escalated_at - escalate_at``), from due to the notice's
  arrival at the webhook, from the escalation to that arrival, and from due to the
  notice's delivery recorded (``escalation_notified_at``): min, p50, p99 and max. Every
  time is the database's: the webhook reads the database's clock (``Store.now()``) as
  each notice arrives, before it answers.

Also printed: how long before the due time the last worker registered (negative: it
started late, and its share of the calls was escalated late). Figures, not assertions.
About 45 s a backend (setting up the suspensions is most of it).

Run: .venv/bin/python benchmarks/escalations.py [--calls 1000] [--workers 3] [--lead 15]
     [--backends postgresql,sqlite] [--no-analyze]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_agent  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from compare_common import fresh_database  # noqa: E402
from throughput import start_workers, worker_env  # noqa: E402

from tether import Engine, MemoryNotifier  # noqa: E402
from tether.config import Settings  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402
from tether.store.backend.clock import db_now  # noqa: E402
from tether.store.sql.schema import audit, pending_calls, run_events, workers  # noqa: E402

CHUNK = 20  # runs suspended at once while setting up


class Hook:
    """A webhook that stamps each escalation notice with the database's clock."""

    def __init__(self, store: Store) -> None:
        self.arrived: list[tuple[str, str, float]] = []  # (run id, tool call id, db time)
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("escalated"):
                    at = store.now()
                    with lock:
                        outer.arrived.append((body["run_id"], body["tool_call_id"], at))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _suspend(url: str, calls: int) -> None:
    """``calls`` runs suspended on one ``page`` call each."""
    eng = Engine(
        agent=bench_agent.escalating_agent(),
        model=bench_agent.model(),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )
    try:
        for start in range(0, calls, CHUNK):
            asked = [eng.ask("bench", f"page {i}") for i in range(start, min(calls, start + CHUNK))]
            for outcome in await asyncio.gather(*asked):
                assert outcome.kind.value == "suspended", outcome
    finally:
        await eng.aclose()


def _analyzed(store: Store) -> None:
    """PostgreSQL's statistics of the tables just filled, as autovacuum would have them
    (this machine's server runs with it off): the planner's picture of a deployment."""
    if store.dialect.name == "postgresql":
        with store.begin() as conn:
            for table in ("runs", "pending_calls", "decisions", "run_events", "audit"):
                conn.exec_driver_sql(f"ANALYZE {table}")


def _due_together(store: Store, lead_s: float) -> float:
    """Every call due ``lead_s`` from now by the database's clock; that due time."""
    with store.begin() as conn:
        conn.execute(pending_calls.update().values(escalate_at=db_now() + lead_s))
        due = conn.execute(sa.select(sa.func.max(pending_calls.c.escalate_at))).scalar_one()
    return float(due)


def _wait(store: Store, hook: Hook, args: argparse.Namespace, due: float) -> float:
    """Until the workers registered (how long before ``due`` the last one did), then
    until every escalation's notice arrived or ``--timeout`` passed."""
    count = sa.select(sa.func.count(), sa.func.max(workers.c.started_at))
    registered, last = 0, due
    deadline = time.monotonic() + args.lead + args.timeout
    while time.monotonic() < deadline and (
        registered < args.workers or len(hook.arrived) < args.calls
    ):
        if registered < args.workers:
            with store.engine.connect() as conn:
                registered, last = conn.execute(count).one()
        time.sleep(0.2)
    return due - float(last or due)


def _read(store: Store) -> dict[str, Any]:
    """Per call: its due, escalated and notified times, and its events and records."""
    with store.engine.connect() as conn:
        calls = conn.execute(
            sa.select(
                pending_calls.c.run_id,
                pending_calls.c.tool_call_id,
                pending_calls.c.escalate_at,
                pending_calls.c.escalated_at,
                pending_calls.c.escalation_notified_at,
            )
        ).all()
        events = conn.execute(
            sa.select(run_events.c.run_id, run_events.c.data).where(
                run_events.c.kind == "escalated"
            )
        ).all()
        records = conn.execute(
            sa.select(audit.c.run_id, audit.c.tool_call_id).where(audit.c.kind == "escalated")
        ).all()
    return {
        "calls": {(r.run_id, r.tool_call_id): r for r in calls},
        "events": collections.Counter((r.run_id, r.data["tool_call_id"]) for r in events),
        "records": collections.Counter((r.run_id, r.tool_call_id) for r in records),
    }


def _round(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_database(backend) as db:
        store = Store(db.url)
        upgrade(store.engine)
        began = time.monotonic()
        asyncio.run(_suspend(db.url, args.calls))
        setup_s = time.monotonic() - began
        if not args.no_analyze:
            _analyzed(store)
        hook = Hook(store)
        env = worker_env(db.url)
        env.update(BENCH_SCRIPT="page", TETHER_WEBHOOK_URL=hook.url)
        env["TETHER_REAPER_INTERVAL_S"] = "60"
        command = [sys.executable, "-m", "tether", "worker"]
        command += ["--agent", "bench_agent:escalating_agent"]
        try:
            due = _due_together(store, args.lead)
            with tempfile.TemporaryDirectory() as logs:
                procs = start_workers(command, env, logs, args.workers)
                try:
                    margin = _wait(store, hook, args, due)
                finally:
                    for proc in procs:
                        proc.terminate()
                    for proc in procs:
                        proc.wait(timeout=60)
            got = _read(store)
        finally:
            hook.close()
            store.close()
    got.update(due=due, margin=margin, setup_s=setup_s, arrived=list(hook.arrived))
    return got


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _report(backend: str, got: dict[str, Any], calls: int) -> None:
    rows = got["calls"]
    escalated = [r for r in rows.values() if r.escalated_at is not None]
    notices = collections.Counter((run_id, call_id) for run_id, call_id, _ in got["arrived"])
    once = {
        "escalated": len(escalated),
        "events": sorted(set(got["events"].values())),
        "records": sorted(set(got["records"].values())),
        "notices": sorted(set(notices.values())),
    }
    exact = (
        once["escalated"] == calls
        and len(got["events"]) == len(got["records"]) == len(notices) == calls
        and once["events"] == once["records"] == once["notices"] == [1]
    )
    print(
        f"{backend:<11} {calls} calls set up in {got['setup_s']:.1f} s; last worker registered "
        f"{got['margin']:.1f} s before due; escalated {once['escalated']}, per call: events "
        f"{once['events']}, audit records {once['records']}, notices {once['notices']}  "
        f"{'PASS' if exact else 'MISS'}"
    )
    first: dict[tuple[str, str], float] = {}
    for run_id, call_id, at in got["arrived"]:
        first.setdefault((run_id, call_id), at)
    spans = {
        "due -> escalated": [r.escalated_at - r.escalate_at for r in escalated],
        "due -> notice at webhook": [at - rows[key].escalate_at for key, at in first.items()],
        "escalated -> notice": [at - rows[key].escalated_at for key, at in first.items()],
        "due -> delivery recorded": [
            r.escalation_notified_at - r.escalate_at
            for r in escalated
            if r.escalation_notified_at is not None
        ],
    }
    for name, values in spans.items():
        if values:
            ms = [v * 1000 for v in values]
            print(
                f"{backend:<11} {name:<26} {len(ms):>5} {min(ms):>7.0f} {_p(ms, 0.5):>7.0f} "
                f"{_p(ms, 0.99):>7.0f} {max(ms):>7.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--lead", type=float, default=15.0)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument(
        "--no-analyze", action="store_true", help="leave PostgreSQL's statistics as they are"
    )
    args = parser.parse_args()
    os.environ["BENCH_SCRIPT"] = "page"
    print(
        f"{args.calls} suspended calls due together, {args.workers} workers racing to escalate "
        f"them; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'backend':<11} {'span (database clock)':<26} {'calls':>5} {'min ms':>7} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"
    )
    for backend in args.backends.split(","):
        _report(backend, _round(backend, args), args.calls)


if __name__ == "__main__":
    main()
