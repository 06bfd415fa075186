"""Capacity: how many runs one ``tether worker`` keeps in flight while they wait on a model.

One ``tether worker`` process (``--concurrency N``) carries N runs at once whose model is
``openai:bench``: the fake OpenAI server of ``fake_model.py``, in a process of its own,
which answers every request after ``--latency`` seconds (default 1 s) through the real
``openai`` SDK over HTTP; each turn calls the read tool ``fetch`` (a plain function). For
each backend (PostgreSQL, SQLite, both as shipped: ``synchronous_commit=on``,
``synchronous=FULL``) and each N (100, 1,000, 5,000), on a fresh database:

1. the worker starts on the empty database and carries 20 short warm-up runs (halted at
   their second step); its RSS with nothing in flight is taken then;
2. N runs of ``--steps`` steps are created (the worker claims them as they come), and once
   all N are in flight the worker gets ``--warmup`` seconds;
3. over the next ``--window`` seconds: steps/s (the runs' ``steps`` summed, on the
   database) against the ideal N / latency; CPU seconds per step of the worker, of
   PostgreSQL (every ``postgres`` process, exited backends included through the
   postmaster's children's times) and of the fake model (``/proc``), with the share of
   the machine's cores they add up to; the event loop's lag in the worker (a task that
   asks to wake every 10 ms, ``bench_agent.LagMonitor``: p50, p99, max); the worker's RSS
   and its growth per in-flight run (from step 1).

Then, per backend, memory over many runs (``--churn``, default 10,000): one worker at
``--churn-inflight`` (1,000) carries that many 3-step runs; its RSS after each tenth of
them has ended (flat is the goal).

With ``--processes P`` (default 1) the worker under test is ``tether worker --processes P``:
a supervisor and P worker processes, each with ``--concurrency`` N / P (rounded up), so N
runs are still in flight in all; the worker's CPU and RSS are the supervisor's and its
processes' summed (``/proc``), and the event loop's lag is read per process (each writes
its lines, with its pid, to the same file): p50 / p99 / max over all of them, and the p99
of each process after the row.

Figures are printed, never asserted; the machine's load average is printed with them.
Run from the repository root (about 6 minutes with the defaults)::

    .venv/bin/python benchmarks/capacity.py [--backends postgresql,sqlite]
        [--inflight 100,1000,5000] [--latency 1.0] [--window 10] [--churn 10000]
        [--only steady|churn] [--processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_agent  # noqa: E402
import throughput  # noqa: E402

from tether import Engine, MemoryNotifier, Settings  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CORES = os.cpu_count() or 1
TARGET_SHARE = 0.9  # of the ideal steps/s
TARGET_KB_PER_RUN = 30.0
TARGET_LAG_P99_MS = 20.0


# -- processes and what /proc says of them -------------------------------------------------


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()  # fields from the 3rd (state) on


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (a supervisor's worker processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return sorted(found)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its processes, those alive and those it has reaped
    (a worker process the supervisor restarted)."""
    fields = _stat(pid)
    reaped = (int(fields[13]) + int(fields[14])) / TICK
    return cpu_s(pid) + reaped + sum(cpu_s(child) for child in children(pid))


def tree_rss_mib(pid: int) -> float:
    """RSS of ``pid`` and of its live processes."""
    return rss_mib(pid) + sum(rss_mib(child) for child in children(pid))


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and, under a supervisor, each of its processes first: killed, a
    supervisor's processes would get SIGTERM and hand their runs back, outliving the
    measurement on the database it is about to drop."""
    for child in children(worker.pid):
        with suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    worker.send_signal(signal.SIGKILL)
    worker.wait()


def postgres_cpu_s() -> float:
    """CPU seconds of every PostgreSQL process now alive, plus those of its exited
    backends (the postmaster's children's times)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            fields = _stat(int(entry))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
        if _is_postmaster(int(entry)):
            total += (int(fields[13]) + int(fields[14])) / TICK  # exited children
    return total


def _is_postmaster(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        parent = int(text[text.rindex(")") + 2 :].split()[1])
        with open(f"/proc/{parent}/comm") as f:
            return f.read().strip() != "postgres"
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return False


@contextmanager
def fake_model(args: argparse.Namespace, steps: int) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The fake OpenAI server in its own process, and its base URL."""
    timing = ["--latency", str(args.latency), "--jitter", str(args.jitter)]
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_model.py"), *timing, "--steps", str(steps)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "listening":
            raise RuntimeError("the fake model did not start")
        yield proc, f"http://127.0.0.1:{line[1]}/v1"
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Database:
    backend: str
    url: str
    name: str | None = None  # PostgreSQL's database, dropped at the end
    folder: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def fresh(cls, backend: str) -> Database:
        if backend == "postgresql":
            name, url = throughput.fresh_database()
            return cls(backend, url, name=name)
        folder = tempfile.TemporaryDirectory(prefix="tether-capacity-")
        url = f"sqlite:///{folder.name}/capacity.db"
        store = Store(url)
        upgrade(store.engine)
        store.close()
        return cls(backend, url, folder=folder)

    def drop(self) -> None:
        if self.name is not None:
            throughput.drop_database(self.name)
        if self.folder is not None:
            self.folder.cleanup()


class Watch:
    """What the benchmark reads of the database while the worker works."""

    def __init__(self, url: str) -> None:
        self.store = Store(url)

    def scalar(self, sql: str) -> int:
        with self.store.engine.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar() or 0)

    def steps(self) -> int:
        return self.scalar("SELECT sum(steps) FROM runs")

    def autovacuum(self) -> str:
        """The server's ``autovacuum`` (off, a run's row leaves a dead version at every
        step that nothing removes, and PostgreSQL's CPU per step grows with it)."""
        with self.store.engine.connect() as conn:
            return str(conn.execute(sa.text("SHOW autovacuum")).scalar())

    def in_flight(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM runs WHERE state = 'running' AND owner IS NOT NULL"
        )

    def waiting(self) -> int:
        """Runs created and not yet claimed."""
        return self.scalar("SELECT count(*) FROM runs WHERE state = 'running' AND owner IS NULL")

    def why_failed(self) -> str:
        """The failed runs' reasons and last errors, for a message."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT r.fail_reason, e.data FROM runs r JOIN run_events e ON"
                    " e.run_id = r.id WHERE r.state = 'failed' AND e.kind = 'failed' LIMIT 3"
                )
            ).all()
        return "; ".join(f"{reason}: {str(data)[:300]}" for reason, data in rows)

    def ended(self) -> int:
        return self.scalar("SELECT count(*) FROM runs WHERE state IN ('halted', 'answered')")

    def failed(self) -> int:
        return self.scalar("SELECT count(*) FROM runs WHERE state = 'failed'")

    def close(self) -> None:
        self.store.close()


def create_runs(url: str, count: int, max_steps: int) -> None:
    """``count`` runs of the capacity agent, waiting for a worker, ``max_steps`` each."""

    async def go() -> None:
        engine = Engine(
            agent=bench_agent.capacity_agent(),
            model=bench_agent.model(),  # never called: this engine only creates runs
            settings=Settings(database_url=url),
            notifier=MemoryNotifier(),
        )
        limits = {"max_steps": max_steps, "max_tool_calls": max_steps, "max_elapsed_ms": 86_400_000}
        try:
            for start in range(0, count, 50):
                batch = range(start, min(count, start + 50))
                await asyncio.gather(
                    *(engine.start_run("bench", f"job {i}", limits=limits) for i in batch)
                )
        finally:
            await engine.aclose()

    asyncio.run(go())


def start_worker(
    url: str, model_url: str, concurrency: int, lag_file: str, log: str, processes: int = 1
) -> subprocess.Popen[bytes]:
    """``tether worker`` carrying ``concurrency`` runs at once, in ``processes`` processes
    (each carrying its share) under a supervisor when more than one."""
    env = throughput.worker_env(url)
    env.update(
        TETHER_MODEL="openai:bench",
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="sk-bench",
        BENCH_LAG_FILE=lag_file,
    )
    share = -(-concurrency // processes)  # rounded up
    command = [
        sys.executable, "-m", "tether", "worker", "--no-reap", "--concurrency", str(share),
        "--processes", str(processes), "--agent", "bench_agent:capacity_agent",
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w")
    )


def wait_for(
    what: str,
    check: Any,
    timeout: float,
    proc: subprocess.Popen[bytes],
    log: str,
    *,
    give_up: bool = False,
) -> float:
    """Poll ``check()`` until true (the seconds it took); fail if the worker died. Says
    what it waits for every 10 s. With ``give_up``, past ``timeout`` it returns the time
    waited instead of failing."""
    began = said = time.monotonic()
    while not check():
        if time.monotonic() - said > 10:
            print(f"  ... waiting for {what} ({time.monotonic() - began:.0f} s)", flush=True)
            said = time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited: {Path(log).read_text()[-2000:]}")
        if time.monotonic() - began > timeout:
            if give_up:
                print(f"  ... gave up waiting for {what} after {timeout:g} s", flush=True)
                return time.monotonic() - began
            raise RuntimeError(f"timed out waiting for {what}: {Path(log).read_text()[-2000:]}")
        time.sleep(0.2)
    return time.monotonic() - began


def lag_samples(
    path: str, since: float, until: float
) -> tuple[dict[int, list[float]], list[float]]:
    """The event loop's lag samples (ms) between ``since`` and ``until`` by process (pid),
    and the garbage collector's full (generation 2) pauses meanwhile."""
    lags: dict[int, list[float]] = {}
    full: list[float] = []
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        if since <= entry["at"] <= until:
            lags.setdefault(entry.get("pid", 0), []).extend(entry["lag_ms"])
            full.extend(entry["gc_ms"]["2"])
    return lags, full


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def profile(pid: int, args: argparse.Namespace, label: str) -> None:
    """Sleep through the window; with ``--profile DIR``, sample the worker meanwhile with
    py-spy (``pip install py-spy``; not a dependency of tether) into DIR/LABEL.txt, as
    collapsed stacks with their sample counts."""
    if args.profile is None:
        time.sleep(args.window)
        return
    out = Path(args.profile) / f"{label}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking"]
    spy += ["--subprocesses"] if args.processes > 1 else []
    spy += ["--gil", "-r", "250", "-p", str(pid), "-d", str(int(args.window))]
    spy += ["-f", "raw", "-o", str(out)]
    subprocess.run(spy, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- the steady state ----------------------------------------------------------------------


@dataclass
class Steady:
    backend: str
    inflight: int
    ramp_s: float
    steps_per_s: float
    ideal: float
    worker_ms: float
    postgres_ms: float
    model_ms: float
    busy: float  # share of the machine's cores the three took
    lag_by_process: dict[int, list[float]]
    gc_full: list[float]  # the full collections' pauses in the window (ms)
    carried: int  # runs in flight once the ramp ended (all of them unless it gave up)
    rss_idle: float
    rss_ramped: float
    rss: float
    failed: int
    autovacuum: str | None = None  # PostgreSQL's setting during the run
    processes: int = 1

    @property
    def lag(self) -> list[float]:
        """Every process's lag samples."""
        return [ms for samples in self.lag_by_process.values() for ms in samples]

    @property
    def kb_per_run(self) -> float:
        """RSS growth from none to every run in flight, per run."""
        return (self.rss_ramped - self.rss_idle) * 1024 / max(1, self.carried)


def steady(backend: str, inflight: int, args: argparse.Namespace) -> Steady:
    db = Database.fresh(backend)
    watch = Watch(db.url)
    steps = args.steps
    try:
        with fake_model(args, steps) as (model, model_url), tempfile.TemporaryDirectory() as tmp:
            lag_file, log = f"{tmp}/lag.jsonl", f"{tmp}/worker.log"
            worker = start_worker(db.url, model_url, inflight, lag_file, log, args.processes)
            try:
                create_runs(db.url, 20, 2)  # warm-up: halted at their second step
                wait_for("the warm-up", lambda: watch.ended() >= 20, 120, worker, log)
                time.sleep(1.0)
                rss_idle = tree_rss_mib(worker.pid)
                create_runs(db.url, inflight, steps)
                ramp = wait_for(
                    f"{inflight} runs in flight",
                    lambda: watch.waiting() == 0,
                    args.ramp_timeout,
                    worker,
                    log,
                    give_up=True,
                )
                carried = watch.in_flight()
                if watch.failed():
                    raise RuntimeError(f"runs failed: {watch.why_failed()}")
                rss_ramped = tree_rss_mib(worker.pid)  # the runs in flight, a step or two in
                time.sleep(args.warmup)
                s0, t0 = watch.steps(), time.time()
                cpu0 = (tree_cpu_s(worker.pid), postgres_cpu_s(), cpu_s(model.pid))
                profile(worker.pid, args, f"{backend}-{inflight}")
                s1, t1 = watch.steps(), time.time()
                cpu1 = (tree_cpu_s(worker.pid), postgres_cpu_s(), cpu_s(model.pid))
                rss = tree_rss_mib(worker.pid)
                failed = watch.failed()
                autovacuum = watch.autovacuum() if backend == "postgresql" else None
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited: {Path(log).read_text()[-2000:]}")
                lag, gc_full = lag_samples(lag_file, t0, t1)
            finally:
                stop_worker(worker)
        done = max(1, s1 - s0)
        used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
        if backend != "postgresql":
            used[1] = 0.0
        return Steady(
            backend=backend,
            inflight=inflight,
            ramp_s=ramp,
            steps_per_s=(s1 - s0) / (t1 - t0),
            ideal=inflight / args.latency,
            worker_ms=used[0] * 1000 / done,
            postgres_ms=used[1] * 1000 / done,
            model_ms=used[2] * 1000 / done,
            busy=sum(used) / (t1 - t0) / CORES,
            lag_by_process=lag,
            gc_full=gc_full,
            carried=carried,
            rss_idle=rss_idle,
            rss_ramped=rss_ramped,
            rss=rss,
            failed=failed,
            autovacuum=autovacuum,
            processes=args.processes,
        )
    finally:
        watch.close()
        db.drop()


def print_steady(rows: list[Steady], args: argparse.Namespace) -> None:
    print(
        f"\nsteady state: model latency {args.latency:g} s, runs of {args.steps} steps, "
        f"{args.window:g} s window after {args.warmup:g} s; {CORES} cores; "
        f"{args.processes} worker process(es); "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    head = (
        f"{'backend':<11}{'in flight':>10}{'ramp s':>8}{'steps/s':>9}{'ideal':>7}{'share':>7}"
        f"{'worker ms':>10}{'pg ms':>7}{'model ms':>9}{'cores':>7}"
        f"{'lag p50':>8}{'p99':>7}{'max':>7}{'RSS MiB':>9}{'KB/run':>8}"
    )
    print(head)
    for r in rows:
        share = r.steps_per_s / r.ideal
        print(
            f"{r.backend:<11}{r.inflight:>10}{r.ramp_s:>8.1f}{r.steps_per_s:>9.1f}{r.ideal:>7.0f}"
            f"{share:>7.0%}{r.worker_ms:>10.2f}{r.postgres_ms:>7.2f}{r.model_ms:>9.2f}"
            f"{r.busy:>7.0%}{percentile(r.lag, 0.5):>8.1f}{percentile(r.lag, 0.99):>7.1f}"
            f"{max(r.lag, default=float('nan')):>7.1f}{r.rss:>9.1f}{r.kb_per_run:>8.1f}"
            f"{len(r.gc_full):>4} x{max(r.gc_full, default=0):>4.0f}"
            + (f"  ({r.failed} failed)" if r.failed else "")
            + (f"  (only {r.carried} in flight)" if r.carried < r.inflight else "")
            + (f"  autovacuum {r.autovacuum}" if r.autovacuum else "")
            + (f"  lag p99 by process: {_per_process(r)}" if r.processes > 1 else "")
        )
    print(
        f"targets: share >= {TARGET_SHARE:.0%} (at 1,000: or every core busy); "
        f"lag p99 <= {TARGET_LAG_P99_MS:g} ms at 1,000; <= {TARGET_KB_PER_RUN:g} KB per run"
    )


def _per_process(row: Steady) -> str:
    """Each process's lag p99 (ms), in the order of their pids."""
    return " / ".join(
        f"{percentile(samples, 0.99):.1f}" for _, samples in sorted(row.lag_by_process.items())
    )


# -- memory over many runs -----------------------------------------------------------------


def churn(backend: str, args: argparse.Namespace) -> list[tuple[int, float]]:
    """RSS (MiB) after each tenth of ``args.churn`` 3-step runs has ended."""
    db = Database.fresh(backend)
    watch = Watch(db.url)
    marks: list[tuple[int, float]] = []
    try:
        create_runs(db.url, args.churn, 3)
        with fake_model(args, 3) as (_model, model_url), tempfile.TemporaryDirectory() as tmp:
            lag_file, log = f"{tmp}/lag.jsonl", f"{tmp}/worker.log"
            worker = start_worker(
                db.url, model_url, args.churn_inflight, lag_file, log, args.processes
            )
            try:
                tenth = args.churn // 10
                for k in range(1, 11):
                    wait_for(
                        f"{k * tenth} runs ended",
                        lambda k=k: watch.ended() >= k * tenth,
                        1800,
                        worker,
                        log,
                    )
                    marks.append((watch.ended(), tree_rss_mib(worker.pid)))
            finally:
                stop_worker(worker)
        return marks
    finally:
        watch.close()
        db.drop()


def print_churn(backend: str, marks: list[tuple[int, float]], args: argparse.Namespace) -> None:
    print(
        f"\nmemory over {args.churn} runs of 3 steps, {args.churn_inflight} in flight, "
        f"{backend}: RSS MiB after each tenth ended (load average {os.getloadavg()[0]:.2f})"
    )
    print("  " + "  ".join(f"{n}: {rss:.1f}" for n, rss in marks))
    first, last = marks[0][1], marks[-1][1]
    print(f"  growth from the first tenth to the last: {last - first:+.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument("--inflight", default="100,1000,5000")
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--jitter", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--ramp-timeout", type=float, default=300.0)
    parser.add_argument("--churn", type=int, default=10_000)
    parser.add_argument("--churn-inflight", type=int, default=1000)
    parser.add_argument("--only", choices=["steady", "churn"])
    parser.add_argument("--profile", help="a folder for py-spy profiles of the worker")
    parser.add_argument(
        "--processes", type=int, default=1, help="tether worker --processes P (default 1)"
    )
    args = parser.parse_args()
    backends = args.backends.split(",")
    if args.only != "churn":
        rows = []
        for backend in backends:
            for n in (int(x) for x in args.inflight.split(",")):
                rows.append(steady(backend, n, args))
                print_steady(rows[-1:], args)
        print_steady(rows, args)
    if args.only != "steady":
        for backend in backends:
            print_churn(backend, churn(backend, args), args)


if __name__ == "__main__":
    main()
