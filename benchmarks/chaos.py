"""Chaos soak: tether under random worker kills and dropped database connections,
checked afterwards in the manner of Jepsen.

It drives tether as an operator would, through its CLI and HTTP API only: the demo
sandbox (``tether sandbox serve``), ``tether migrate``, the API alone (``tether serve
--workers 0``) and K ``tether worker`` processes share one database. N runs of the demo
story are created with ``POST /v1/runs``; each suspension's notice arrives on a local
webhook and is approved with ``POST /v1/approvals/{token}``. Meanwhile a random worker is
SIGKILLed now and then (and replaced at once), and every connection to tether's database
is terminated now and then (PostgreSQL). ``GET /v1/runs/{id}`` is sampled throughout.
Once every run was created and decided, the faults stop and the system settles; the
databases are then read directly to check the history:

1. each write took effect at most once per idempotency key (the sandbox's records and
   quotes; no quote sent twice), tether's ledger has one entry per key, an intent before
   every effect and no outcome that denies one, and the tool results the model saw name
   the quotes that were made;
2. every run ended in a defined state (none left running or suspended; failed and
   halted runs are listed with their reasons) and no terminal state changed;
3. messages are append-only: every sample is a prefix of every later one and of the end;
4. consumed budgets never decrease across a run's samples;
5. no tether process exited unless it was killed;
6. every run was created and decided before ``--deadline-s``.

Exit 0 on PASS, 1 on FAIL. Run from the repository root:
.venv/bin/python benchmarks/chaos.py [--runs 1000] [--workers 3] [--seed S]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import psycopg

PYTHON = sys.executable
ADMIN_URL = os.environ.get("TETHER_CHAOS_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DANA_KEY = "tether-demo-dana"  # the demo user's fixed API key (README)
QUESTION = "Draft and send a quote for Henderson, 200 of SKU-4411"

# Short windows so that a killed worker's runs are orphans within seconds, and enough
# recoveries that random kills never exhaust them (every run is expected to finish).
HEARTBEAT_TIMEOUT_S = 2
REAPER_INTERVAL_S = 1
MAX_RECOVERY_ATTEMPTS = 50

SETTLED = frozenset({"answered", "failed", "halted", "cancelled"})
TERMINAL = frozenset({"answered", "failed", "cancelled"})
BUDGET_FIELDS = ("steps", "tool_calls", "spend_usd", "elapsed_ms")
TOOL_OF_ACTION = {"created": "draft_quote", "sent": "send_quote"}

CREATORS = 4
APPROVERS = 4
SAMPLERS = 2
SAMPLE_PAUSE_S = 0.05
REFRESH_EVERY_S = 2.0  # the list of runs, to learn which settled
PROGRESS_EVERY_S = 5.0
HTTP_TIMEOUT_S = 60.0
SHOWN = 10  # problems shown per check


class ChaosError(Exception):
    """The soak itself cannot go on (a process would not start, an unexpected answer)."""


# -- options ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Options:
    runs: int
    workers: int
    concurrency: int
    database_url: str | None
    seed: int
    kill_every_s: float
    db_fault_every_s: float
    min_kills: int
    min_db_faults: int
    rate: float
    deadline_s: float
    settle_s: float
    logs: Path | None


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--runs", type=int, default=1000, help="runs of the demo story (default 1000)")
    add("--workers", type=int, default=3, help="tether worker processes (default 3)")
    add("--concurrency", type=int, default=8, help="runs each worker carries at once")
    add(
        "--database-url",
        help="tether's database: postgresql://... or sqlite:///PATH, or 'sqlite' for a "
        "file in the logs folder (default: a fresh PostgreSQL database tether_chaos_* on "
        f"{ADMIN_URL}, dropped at the end)",
    )
    add("--seed", type=int, default=None, help="random seed (default: random, printed)")
    add("--kill-every-s", type=float, default=5.0, help="mean s between SIGKILLs (0: none)")
    add(
        "--db-fault-every-s",
        type=float,
        default=10.0,
        help="mean s between rounds of pg_terminate_backend (0: none; PostgreSQL only)",
    )
    add("--min-kills", type=int, default=0, help="keep the faults on until this many kills")
    add("--min-db-faults", type=int, default=0, help="... and this many DB-fault rounds")
    add("--rate", type=float, default=0.0, help="runs created per second (0: at once)")
    add("--deadline-s", type=float, default=3600.0, help="give up the fault phase after")
    add("--settle-s", type=float, default=120.0, help="how long runs may take to settle")
    add("--logs", type=Path, default=None, help="folder for the logs (default: a temp one)")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**31)
    options = Options(**vars(args))
    problem = _invalid(options)
    if problem:
        parser.error(problem)
    return options


def _invalid(o: Options) -> str | None:
    if o.runs < 1 or o.workers < 1 or o.concurrency < 1:
        return "--runs, --workers and --concurrency must be at least 1"
    if min(o.kill_every_s, o.db_fault_every_s, o.rate, o.min_kills, o.min_db_faults) < 0:
        return "rates, intervals and minimums cannot be negative"
    if o.min_kills and not o.kill_every_s:
        return "--min-kills needs --kill-every-s"
    sqlite = (o.database_url or "").startswith("sqlite")
    if o.min_db_faults and (sqlite or not o.db_fault_every_s):
        return "--min-db-faults needs PostgreSQL and --db-fault-every-s"
    return None


# -- the database ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    url: str
    created: str | None = None  # the PostgreSQL database this tool created (and drops)

    @property
    def postgres(self) -> bool:
        return self.url.startswith("postgresql")

    @property
    def name(self) -> str:
        return self.url.rpartition("/")[2].partition("?")[0]


def libpq(url: str) -> str:
    """A SQLAlchemy-style PostgreSQL URL as libpq takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def open_database(option: str | None, folder: Path) -> Database:
    if option == "sqlite":
        return Database(f"sqlite:///{folder / 'tether.db'}")
    if option is not None:
        return Database(option)
    name = f"tether_chaos_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return Database(ADMIN_URL.rpartition("/")[0] + "/" + name, created=name)


def drop_database(db: Database) -> None:
    if db.created:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db.created} WITH (FORCE)")


def read_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on tether's database (PostgreSQL or SQLite), read directly."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.split(":///", 1)[1])) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(libpq(url)) as conn:
        return conn.execute(sql).fetchall()


def connect_admin(url: str) -> psycopg.Connection[Any]:
    """The soak's own connection to tether's PostgreSQL database (spared by the faults)."""
    return psycopg.connect(libpq(url), autocommit=True)


def terminate_backends(conn: psycopg.Connection[Any], dbname: str) -> int:
    """Terminate every connection to ``dbname`` but ``conn`` itself; how many went."""
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        (dbname,),
    ).fetchall()
    return sum(1 for (ok,) in rows if ok)


# -- processes -------------------------------------------------------------------------------


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    log: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Cluster:
    """The soak's processes (sandbox, API, workers); each can be restarted as it was."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env: dict[str, str] = {}
        self.commands: dict[str, list[str]] = {}
        self.procs: dict[str, Proc] = {}
        self.starts: Counter[str] = Counter()
        self.exits: list[str] = []  # processes that exited without being killed

    def start(self, role: str, *args: str) -> Proc:
        """Start ``role`` (with ``args`` the first time, as before after that)."""
        if args:
            self.commands[role] = list(args)
        self.starts[role] += 1
        log = self.folder / f"{role}.{self.starts[role]}.log"
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                [PYTHON, "-m", "tether", *self.commands[role]],
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the soak, which stops them
            )
        self.procs[role] = Proc(role, popen, log)
        return self.procs[role]

    def workers(self) -> list[str]:
        return sorted(role for role in self.procs if role.startswith("worker"))

    def kill_random_worker(self, rng: random.Random) -> str:
        """SIGKILL a random worker and start its replacement at once."""
        role = rng.choice(self.workers())
        old = self.procs[role].popen
        old.kill()
        old.wait()
        new = self.start(role).popen
        return f"SIGKILL {role} (pid {old.pid}); replaced by pid {new.pid}"

    def revive(self) -> list[str]:
        """Restart every process that exited on its own; what happened, for the log."""
        events = []
        for role, proc in list(self.procs.items()):
            code = proc.popen.poll()
            if code is None:
                continue
            what = f"{role} (pid {proc.popen.pid}) exited on its own with {code}; {proc.log}"
            self.exits.append(f"{what}:\n{tail(proc.log)}")
            events.append(f"{what}; restarted as pid {self.start(role).popen.pid}")
        return events

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM every process, then SIGKILL those still there after ``grace_s``."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.terminate()
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()


def tether_env(database_url: str, sandbox_url: str, webhook_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(
        TETHER_DATABASE_URL=database_url,
        TETHER_SANDBOX_URL=sandbox_url,
        TETHER_WEBHOOK_URL=webhook_url,
        TETHER_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S),
        TETHER_REAPER_INTERVAL_S=str(REAPER_INTERVAL_S),
        TETHER_MAX_RECOVERY_ATTEMPTS=str(MAX_RECOVERY_ATTEMPTS),
    )
    return env


async def wait_ok(proc: Proc, url: str, timeout_s: float = 60.0) -> None:
    """Poll ``url`` until it answers 200; fail if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ChaosError(f"{proc.role} exited at start-up:\n{tail(proc.log)}")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise ChaosError(f"{proc.role} not ready at {url} within {timeout_s}s:\n{tail(proc.log)}")


def migrate(env: dict[str, str]) -> None:
    done = subprocess.run(
        [PYTHON, "-m", "tether", "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ChaosError(f"tether migrate failed:\n{done.stdout}{done.stderr}")


# -- the webhook -----------------------------------------------------------------------------


class NoticeInbox:
    """A local webhook: receives suspension notices on a thread and hands each to
    ``deliver`` on the event loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, deliver: Callable[[dict[str, Any]], None]
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    notice = json.loads(self.rfile.read(length))
                    loop.call_soon_threadsafe(deliver, notice)
                except ValueError:  # cut off (its sender was killed): it will be re-sent
                    self.send_response(400)
                except RuntimeError:  # the soak is over; the notice no longer matters
                    self.send_response(503)
                else:
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notices"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> NoticeInbox:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


# -- what was seen ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One ``GET /v1/runs/{id}``: when it was sent and answered, and what it showed."""

    sent: float
    received: float
    state: str
    messages: list[Any]
    consumed: dict[str, float]


@dataclass
class Track:
    """What the soak knows of one run."""

    run_id: str
    tokens: list[str] = field(default_factory=list)  # in the order their notices came
    tried: set[str] = field(default_factory=set)  # tokens answered definitively
    decided: bool = False
    busy: bool = False  # an approver holds it
    retries: int = 0
    state: str | None = None
    samples: list[Sample] = field(default_factory=list)
    final: dict[str, Any] | None = None

    def next_token(self) -> str | None:
        """The newest token not yet answered definitively."""
        return next((t for t in reversed(self.tokens) if t not in self.tried), None)

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


@dataclass
class Stats:
    kills: int = 0
    db_rounds: int = 0
    terminated: int = 0
    notices: int = 0
    created: int = 0
    create_retries: int = 0
    create_ambiguous: int = 0
    approvals: Counter[str] = field(default_factory=Counter)
    refusals: list[str] = field(default_factory=list)
    deadline_hit: bool = False


def sample_of(body: dict[str, Any], sent: float, received: float) -> Sample:
    consumed = body["budget"]["consumed"]
    return Sample(
        sent=sent,
        received=received,
        state=str(body["state"]),
        messages=list(body["messages"]),
        consumed={name: float(consumed[name]) for name in BUDGET_FIELDS},
    )


def classify(status: int | None, body: dict[str, Any]) -> str:
    """What an approval's answer means for the run: decided, changed (a new token),
    stale (token superseded or expired), retry, or refused (unexpected)."""
    if status is None or status >= 500:
        return "retry"
    if status == 200:
        return "decided"
    code = body.get("error")
    if code in ("already_resumed", "guard_failed", "no_longer_permitted"):
        return "decided"
    if code == "changed" and body.get("token"):
        return "changed"
    if code == "unknown_or_expired":
        return "stale"
    return "refused"


# -- the soak --------------------------------------------------------------------------------


class Soak:
    """Creates and approves runs, samples them and injects faults, all on one loop."""

    def __init__(
        self, options: Options, db: Database, cluster: Cluster, client: httpx.AsyncClient
    ) -> None:
        self.options = options
        self.db = db
        self.cluster = cluster
        self.client = client
        self.rng = random.Random(options.seed)
        self.runs: dict[str, Track] = {}
        self.stats = Stats()
        self.approvals: asyncio.Queue[str] = asyncio.Queue()
        self.faults_over = asyncio.Event()
        self.started = time.monotonic()
        self.refreshed = 0.0
        self.next_index = 0

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    def track(self, run_id: str) -> Track:
        return self.runs.setdefault(run_id, Track(run_id))

    def unsettled(self) -> list[Track]:
        return [t for t in self.runs.values() if not t.settled]

    # -- creating runs

    async def creator(self) -> None:
        while self.next_index < self.options.runs:
            index, self.next_index = self.next_index, self.next_index + 1
            if self.options.rate:
                due = self.started + index / self.options.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            self.track(await self.start_run())
            self.stats.created += 1

    async def start_run(self) -> str:
        """POST one run, retrying what may be transient (a 5xx or a dropped request; such
        a run may exist anyway, and is adopted when its notice comes)."""
        for attempt in itertools.count():
            try:
                response = await self.client.post("/v1/runs", json={"question": QUESTION})
            except httpx.ConnectError:
                response = None
            except httpx.HTTPError:
                self.stats.create_ambiguous += 1
                response = None
            if response is not None and response.status_code == 202:
                return str(response.json()["id"])
            if response is not None and response.status_code < 500:
                raise ChaosError(f"POST /v1/runs: {response.status_code} {response.text}")
            if response is not None:
                self.stats.create_ambiguous += 1
            self.stats.create_retries += 1
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")

    # -- approving

    def on_notice(self, notice: dict[str, Any]) -> None:
        self.stats.notices += 1
        track = self.track(str(notice["run_id"]))
        token = str(notice["token"])
        if token not in track.tokens:
            track.tokens.append(token)
            track.decided = False  # a new suspension (or a re-issued notice) to decide
            self.approvals.put_nowait(track.run_id)

    async def approver(self) -> None:
        while True:
            track = self.runs[await self.approvals.get()]
            if track.busy:
                continue  # its approver picks the new token up when done
            track.busy = True
            try:
                await self.decide(track)
            finally:
                track.busy = False

    async def decide(self, track: Track) -> None:
        """Approve with the newest token until decided, or until none is left to try."""
        while not track.decided and (token := track.next_token()) is not None:
            status, body = await self.post_approval(token)
            label = body.get("outcome") or body.get("error") or "no answer"
            self.stats.approvals[f"{status or '---'} {label}"] += 1
            kind = classify(status, body)
            if kind == "retry":
                track.retries += 1
                delay = min(3.0, 0.1 * 2 ** min(track.retries, 5))
                loop = asyncio.get_running_loop()
                loop.call_later(delay, self.approvals.put_nowait, track.run_id)
                return
            track.tried.add(token)
            if kind == "decided":
                track.decided = True
            elif kind == "changed":
                track.tokens.append(str(body["token"]))
            elif kind == "refused":
                self.stats.refusals.append(f"{track.run_id}: {status} {body}")

    async def post_approval(self, token: str) -> tuple[int | None, dict[str, Any]]:
        try:
            response = await self.client.post(
                f"/v1/approvals/{token}", json={"decision": "approve"}
            )
        except httpx.HTTPError as exc:
            return None, {"error": type(exc).__name__}
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text[:200]}
        return response.status_code, body if isinstance(body, dict) else {}

    # -- sampling

    async def sample(self, track: Track) -> dict[str, Any] | None:
        """GET the run and keep what it shows; None when it did not answer 200."""
        sent = time.monotonic()
        try:
            response = await self.client.get(f"/v1/runs/{track.run_id}")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        body: dict[str, Any] = response.json()
        track.samples.append(sample_of(body, sent, time.monotonic()))
        track.state = str(body["state"])
        return body

    async def sampler(self) -> None:
        while True:
            candidates = self.unsettled()
            if candidates:
                await self.sample(self.rng.choice(candidates))
            await asyncio.sleep(SAMPLE_PAUSE_S)

    async def refresh_states(self) -> None:
        """Learn the runs' states: the list (newest 1000) and a GET of a few not in it;
        at most every ``REFRESH_EVERY_S``."""
        if time.monotonic() - self.refreshed < REFRESH_EVERY_S:
            return
        self.refreshed = time.monotonic()
        listed: set[str] = set()
        try:
            response = await self.client.get("/v1/runs", params={"limit": 1000})
            if response.status_code == 200:
                for item in response.json()["items"]:
                    self.track(str(item["id"])).state = str(item["state"])
                    listed.add(str(item["id"]))
        except httpx.HTTPError:
            pass
        rest = [t for t in self.unsettled() if t.run_id not in listed][:20]
        await asyncio.gather(*(self.sample(t) for t in rest))

    # -- faults

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; True when the fault phase ended meanwhile."""
        try:
            await asyncio.wait_for(self.faults_over.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    async def killer(self) -> None:
        mean = self.options.kill_every_s
        while mean and not await self.pause(self.rng.expovariate(1 / mean)):
            self.say(self.cluster.kill_random_worker(self.rng))
            self.stats.kills += 1

    async def db_faulter(self) -> None:
        mean = self.options.db_fault_every_s
        if not (mean and self.db.postgres):
            return
        conn = await asyncio.to_thread(connect_admin, self.db.url)
        try:
            while not await self.pause(self.rng.expovariate(1 / mean)):
                gone = await asyncio.to_thread(terminate_backends, conn, self.db.name)
                self.stats.db_rounds += 1
                self.stats.terminated += gone
                self.say(f"pg_terminate_backend: {gone} connections to {self.db.name}")
        finally:
            conn.close()

    async def monitor(self) -> None:
        while True:
            for event in self.cluster.revive():
                self.say(event)
            await asyncio.sleep(0.5)

    # -- phases

    def progress(self) -> str:
        states = Counter(t.state or "unseen" for t in self.runs.values())
        shown = " ".join(f"{s} {n}" for s, n in sorted(states.items()))
        decided = sum(1 for t in self.runs.values() if t.decided)
        return (
            f"created {self.stats.created}/{self.options.runs}, decided {decided}; {shown}; "
            f"kills {self.stats.kills}, DB-fault rounds {self.stats.db_rounds}"
        )

    def faults_done(self) -> bool:
        o, s = self.options, self.stats
        return s.created >= o.runs and s.kills >= o.min_kills and s.db_rounds >= o.min_db_faults

    async def fault_phase(self, tasks: list[asyncio.Task[None]]) -> None:
        """Until every run was created and decided (or settled) and the minimum faults
        were injected, or the deadline."""
        shown = time.monotonic()
        while not (self.faults_done() and all(t.decided or t.settled for t in self.runs.values())):
            check_tasks(tasks)
            if time.monotonic() - self.started > self.options.deadline_s:
                self.stats.deadline_hit = True
                self.say(f"deadline of {self.options.deadline_s}s reached")
                break
            if self.stats.created >= self.options.runs:
                await self.refresh_states()
            if time.monotonic() - shown >= PROGRESS_EVERY_S:
                shown = time.monotonic()
                self.say(self.progress())
            await asyncio.sleep(0.5)
        self.faults_over.set()
        self.say(f"faults over; settling. {self.progress()}")

    async def settle(self, tasks: list[asyncio.Task[None]]) -> None:
        """Until no known run is running or suspended, or ``settle_s`` passed."""
        deadline = time.monotonic() + self.options.settle_s
        shown = time.monotonic()
        while self.unsettled() and time.monotonic() < deadline:
            check_tasks(tasks)
            await self.refresh_states()
            if time.monotonic() - shown >= PROGRESS_EVERY_S:
                shown = time.monotonic()
                self.say(self.progress())
            await asyncio.sleep(0.5)
        self.say(f"settled: {self.progress()}")

    async def finals(self, run_ids: set[str]) -> None:
        """The final GET of every run (kept as its last sample)."""
        gate = asyncio.Semaphore(8)

        async def one(track: Track) -> None:
            async with gate:
                for attempt in range(20):
                    body = await self.sample(track)
                    if body is not None:
                        track.final = body
                        return
                    await asyncio.sleep(min(2.0, 0.1 * 2**attempt))

        await asyncio.gather(*(one(self.track(run_id)) for run_id in sorted(run_ids)))

    def jobs(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """The background tasks of the soak."""
        return [
            *[self.creator] * CREATORS,
            *[self.approver] * APPROVERS,
            *[self.sampler] * SAMPLERS,
            self.killer,
            self.db_faulter,
            self.monitor,
        ]

    async def unfinished_details(self) -> dict[str, str]:
        """The last events of every failed or halted run, by run id."""
        return {
            t.run_id: await self.last_events(t.run_id)
            for t in self.runs.values()
            if t.final and t.final["state"] in ("failed", "halted")
        }

    async def last_events(self, run_id: str, count: int = 4) -> str:
        try:
            response = await self.client.get(f"/v1/runs/{run_id}/events")
            items = response.json()["items"][-count:]
        except (httpx.HTTPError, ValueError, KeyError):
            return "(events unavailable)"
        return "; ".join(f"{e['kind']} {json.dumps(e['data'])[:160]}" for e in items)


def check_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Re-raise the error of a background task that died (a bug or a ChaosError)."""
    for task in tasks:
        error = task.exception() if task.done() and not task.cancelled() else None
        if error is not None:
            raise error


# -- the verdict -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    """One idempotency record of the sandbox: a write that took effect."""

    key: str
    action: str
    quote_id: str


@dataclass(frozen=True)
class Quote:
    quote_id: str
    status: str
    created_key: str
    sent_key: str | None


@dataclass(frozen=True)
class Entry:
    """One entry of tether's tool-call ledger."""

    key: str
    run_id: str
    tool: str
    effect: str
    status: str


def run_of(key: str) -> str:
    return key.rsplit(":", 1)[0]  # keys are "{run_id}:{tool_call_id}"


def read_sandbox(path: Path) -> tuple[list[Effect], list[Quote]]:
    with closing(sqlite3.connect(path)) as conn:
        effects = [
            Effect(k, a, q)
            for k, a, q in conn.execute("SELECT key, action, quote_id FROM idempotency_keys")
        ]
        quotes = [
            Quote(*row)
            for row in conn.execute("SELECT quote_id, status, created_key, sent_key FROM quotes")
        ]
    return effects, quotes


def read_ledger(url: str) -> tuple[list[Entry], list[tuple[Any, ...]]]:
    """The ledger's entries, and any key that has more than one."""
    rows = read_rows(url, "SELECT idempotency_key, run_id, tool, effect, status FROM tool_calls")
    entries = [Entry(*row) for row in rows]
    repeated = read_rows(
        url,
        "SELECT idempotency_key, COUNT(*) FROM tool_calls"
        " GROUP BY idempotency_key HAVING COUNT(*) > 1",
    )
    return entries, repeated


def check_sandbox_once(effects: list[Effect], quotes: list[Quote]) -> list[str]:
    """Each key made at most one effect, no quote was sent twice, and each run drafted
    and sent at most one quote (the demo's script asks for one of each)."""
    per_key = Counter(q.created_key for q in quotes) + Counter(
        q.sent_key for q in quotes if q.sent_key
    )
    problems = [f"key {k} made {n} effects" for k, n in per_key.items() if n > 1]
    sends = Counter(e.quote_id for e in effects if e.action == "sent")
    problems += [f"quote {q} sent {n} times" for q, n in sends.items() if n > 1]
    problems += [
        f"quote {q.quote_id} is {q.status} with sent_key {q.sent_key}"
        for q in quotes
        if (q.status == "sent") != (q.sent_key is not None)
    ]
    for what, keys in (
        ("drafted", [q.created_key for q in quotes]),
        ("sent", [q.sent_key for q in quotes if q.sent_key]),
    ):
        per_run = Counter(run_of(k) for k in keys)
        problems += [f"run {r} {what} {n} quotes" for r, n in per_run.items() if n > 1]
    keyed = {e.key for e in effects}
    problems += [
        f"quote {q.quote_id} has no idempotency record"
        for q in quotes
        if q.created_key not in keyed or (q.sent_key and q.sent_key not in keyed)
    ]
    return problems


def check_ledger(
    effects: list[Effect], entries: list[Entry], repeated: list[tuple[Any, ...]]
) -> list[str]:
    """One ledger entry per key; each effect had its intent first, for the same tool, and
    the entry's outcome does not deny it; an ``ok`` write took effect."""
    problems = [f"ledger key {k} has {n} entries" for k, n in repeated]
    by_key = {e.key: e for e in entries}
    for effect in effects:
        entry = by_key.get(effect.key)
        if entry is None:
            problems.append(f"effect {effect.key} ({effect.action}) has no ledger entry")
        elif entry.tool != TOOL_OF_ACTION[effect.action]:
            problems.append(f"effect {effect.key} ({effect.action}) is {entry.tool} in the ledger")
        elif entry.status == "error":
            problems.append(f"{effect.key}: the ledger says error, but it took effect")
    happened = {e.key for e in effects}
    problems += [
        f"{e.key}: the ledger says ok ({e.tool}), but the CRM has no such effect"
        for e in entries
        if e.effect == "write" and e.status == "ok" and e.key not in happened
    ]
    return problems


def check_results(
    effects: list[Effect], entries: list[Entry], tracks: dict[str, Track]
) -> list[str]:
    """What the model was told agrees with what happened: the result of a write that took
    effect names its quote (never an error), and an answered run has every call's outcome."""
    problems = [
        f"run {e.run_id} is answered but its call {e.key} ({e.tool}) is still {e.status}"
        for e in entries
        if e.status in ("intent", "unknown") and _final_state(tracks.get(e.run_id)) == "answered"
    ]
    for effect in effects:
        run_id, _, call_id = effect.key.rpartition(":")
        track = tracks.get(run_id)
        told = tool_result_of(track.final["messages"], call_id) if track and track.final else None
        if told is not None and (
            not isinstance(told, dict) or told.get("quote_id") != effect.quote_id
        ):
            problems.append(
                f"{effect.key} {effect.action} {effect.quote_id}, the model was told {told}"
            )
    return problems


def tool_result_of(messages: list[Any], call_id: str) -> Any:
    """The content of the tool result for ``call_id`` (parsed JSON), or None."""
    for message in messages:
        if message.get("role") == "tool" and message.get("tool_call_id") == call_id:
            content = message.get("content")
            try:
                return json.loads(content) if isinstance(content, str) else content
            except ValueError:
                return content
    return None


def _final_state(track: Track | None) -> str | None:
    return str(track.final["state"]) if track and track.final else None


def check_states(tracks: dict[str, Track]) -> list[str]:
    """Every run ended in a defined state, and none left a terminal state once in it."""
    problems = []
    for track in tracks.values():
        final = track.final
        if final is None:
            problems.append(f"run {track.run_id}: no final state (GET failed)")
        elif final["state"] in ("running", "suspended"):
            problems.append(f"run {track.run_id} left {final['state']} at step {final['step']}")
        for a, b in ordered_pairs(track.samples):
            if a.state in TERMINAL and b.state != a.state:
                problems.append(f"run {track.run_id} went from {a.state} to {b.state}")
    return problems


def ordered_pairs(samples: list[Sample]) -> Iterator[tuple[Sample, Sample]]:
    """Pairs (a, b) where b was asked for after a was answered: b must see a's history."""
    ordered = sorted(samples, key=lambda s: s.sent)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if a.received <= b.sent:
                yield a, b


def check_append_only(tracks: dict[str, Track]) -> list[str]:
    problems = []
    for track in tracks.values():
        for a, b in ordered_pairs(track.samples):
            if b.messages[: len(a.messages)] != a.messages:
                problems.append(
                    f"run {track.run_id}: {len(a.messages)} messages seen, then "
                    f"{len(b.messages)} that do not start with them"
                )
                break
    return problems


def check_budgets(tracks: dict[str, Track]) -> list[str]:
    problems = []
    for track in tracks.values():
        for a, b in ordered_pairs(track.samples):
            fell = [
                f"{name} {a.consumed[name]} -> {b.consumed[name]}"
                for name in BUDGET_FIELDS
                if b.consumed[name] < a.consumed[name]
            ]
            if fell:
                problems.append(f"run {track.run_id}: consumed fell: {', '.join(fell)}")
                break
    return problems


def report_check(title: str, problems: list[str]) -> bool:
    print(f"  {title:<52} {'PASS' if not problems else f'FAIL ({len(problems)})'}")
    for problem in problems[:SHOWN]:
        print(f"      {problem}")
    if len(problems) > SHOWN:
        print(f"      ... and {len(problems) - SHOWN} more")
    return not problems


# -- putting it together ---------------------------------------------------------------------


async def start_cluster(cluster: Cluster, db: Database, sandbox_db: Path, webhook: str) -> str:
    """Start the sandbox, migrate, start the API and the workers; the API's base URL."""
    sandbox_port, api_port = free_port(), free_port()
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    cluster.env = tether_env(db.url, sandbox_url, webhook)
    sandbox = cluster.start(
        "sandbox", "sandbox", "serve", "--port", str(sandbox_port), "--db", str(sandbox_db)
    )
    await wait_ok(sandbox, f"{sandbox_url}/healthz")
    await asyncio.to_thread(migrate, cluster.env)
    api = cluster.start("api", "serve", "--workers", "0", "--port", str(api_port))
    await wait_ok(api, f"http://127.0.0.1:{api_port}/readyz")
    return f"http://127.0.0.1:{api_port}"


async def soak(options: Options, db: Database, cluster: Cluster) -> bool:
    client = httpx.AsyncClient(
        headers={"Authorization": f"Bearer {DANA_KEY}"},
        timeout=HTTP_TIMEOUT_S,
        limits=httpx.Limits(max_connections=32),
    )
    runner = Soak(options, db, cluster, client)
    sandbox_db = cluster.folder / "sandbox.db"
    tasks: list[asyncio.Task[None]] = []
    with NoticeInbox(asyncio.get_running_loop(), runner.on_notice) as inbox:
        try:
            client.base_url = httpx.URL(await start_cluster(cluster, db, sandbox_db, inbox.url))
            for slot in range(1, options.workers + 1):
                cluster.start(f"worker-{slot}", "worker", "--concurrency", str(options.concurrency))
            runner.started = time.monotonic()
            runner.say(f"sandbox, API and {options.workers} workers started; creating runs")
            tasks = [asyncio.create_task(job()) for job in runner.jobs()]
            await runner.fault_phase(tasks)
            await runner.settle(tasks)
            await stop_tasks(tasks)
            stored = {str(row[0]) for row in read_rows(db.url, "SELECT id FROM runs")}
            await runner.finals(stored | set(runner.runs))
            details = await runner.unfinished_details()
        finally:
            await stop_tasks(tasks)
            await client.aclose()
    cluster.stop()  # a quiet system, before its databases are read
    return verdict(db, cluster, runner, sandbox_db, details)


async def stop_tasks(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def verdict(
    db: Database, cluster: Cluster, runner: Soak, sandbox_db: Path, details: dict[str, str]
) -> bool:
    tracks = runner.runs
    effects, quotes = read_sandbox(sandbox_db)
    entries, repeated = read_ledger(db.url)
    print_figures(db, runner, quotes, details)
    print("verdict:")
    late = ["the fault phase hit --deadline-s"] if runner.stats.deadline_hit else []
    results = [
        ("(1a) each key one effect; no quote sent twice", check_sandbox_once(effects, quotes)),
        ("(1b) ledger: one entry per key, agrees", check_ledger(effects, entries, repeated)),
        ("(1c) tool results agree with the effects", check_results(effects, entries, tracks)),
        ("(2) every run in a defined state", check_states(tracks)),
        ("(3) messages append-only", check_append_only(tracks)),
        ("(4) consumed budgets monotone", check_budgets(tracks)),
        ("(5) no process exited unless killed", cluster.exits),
        ("(6) all runs created and decided by the deadline", late),
    ]
    passed = all([report_check(title, problems) for title, problems in results])
    print("PASS" if passed else "FAIL")
    return passed


def print_figures(db: Database, runner: Soak, quotes: list[Quote], details: dict[str, str]) -> None:
    stats, tracks = runner.stats, runner.runs
    print(
        f"faults: {stats.kills} worker kills, {stats.db_rounds} DB-fault rounds "
        f"({stats.terminated} connections terminated)"
    )
    count, first, last = read_rows(
        db.url, "SELECT COUNT(*), MIN(started_at), MAX(updated_at) FROM runs"
    )[0]
    if count:
        span = float(last) - float(first)
        print(
            f"runs: {count} in {span:.1f} s = {count / max(span, 1e-9):.1f} runs/s "
            "(database clock, first start to last update; approvals included)"
        )
    states = Counter(state_label(t.final) for t in tracks.values() if t.final)
    print("states: " + ", ".join(f"{s}: {n}" for s, n in states.most_common()))
    for run_id, events in list(details.items())[:20]:
        final = tracks[run_id].final or {}
        reason = final.get("fail_reason") or final.get("halt_reason")
        print(f"  {run_id} {final.get('state')} ({reason}); last events: {events}")
    sent = {run_of(q.sent_key) for q in quotes if q.sent_key}
    answered = [t.run_id for t in tracks.values() if _final_state(t) == "answered"]
    print(
        f"answered runs with their quote sent: {sum(r in sent for r in answered)}/{len(answered)}"
    )
    print(
        f"creates: {stats.created} (retried {stats.create_retries}, of which "
        f"{stats.create_ambiguous} ambiguous); notices received: {stats.notices}"
    )
    print("approvals: " + ", ".join(f"{k}: {n}" for k, n in stats.approvals.most_common()))
    for refusal in stats.refusals[:SHOWN]:
        print(f"  unexpected refusal {refusal}")
    samples = sum(len(t.samples) for t in tracks.values())
    print(f"samples: {samples} GETs of {len(tracks)} runs")


def state_label(run: dict[str, Any]) -> str:
    reason = run.get("fail_reason") or run.get("halt_reason")
    return f"{run['state']} ({reason})" if reason else str(run["state"])


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    folder = options.logs or Path(tempfile.mkdtemp(prefix="tether-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    for signum in (signal.SIGINT, signal.SIGTERM):  # clean up on either, even when a
        signal.signal(signum, _interrupt)  # shell started the soak with SIGINT ignored
    cluster = Cluster(folder)
    db: Database | None = None
    try:
        db = open_database(options.database_url, folder)
        print(
            f"chaos soak: {options.runs} runs, {options.workers} workers x "
            f"{options.concurrency}, {'PostgreSQL ' + db.name if db.postgres else db.url}, "
            f"seed {options.seed}; kill every ~{options.kill_every_s}s, DB faults every "
            f"~{options.db_fault_every_s}s\nlogs: {folder}",
            flush=True,
        )
        return 0 if asyncio.run(soak(options, db, cluster)) else 1
    except KeyboardInterrupt:
        print("interrupted; cleaning up", flush=True)
        return 130
    except ChaosError as exc:
        print(f"chaos soak could not go on: {exc}", flush=True)
        return 1
    finally:
        cluster.stop()
        if db is not None:
            drop_database(db)


if __name__ == "__main__":
    sys.exit(main())
