"""The ``tether`` CLI in processes of its own, with a test agent (``agents.py``) on a test's
database: their environment, a long-running one started, a short one run to its end; the
processes another one started, whether a process has ended, and its JSON log lines.

Each process is forked by the fork server (``forked.py``, ``forkserver.py``): a process of
its own, started as ``python -m tether`` starts, without paying for the imports again.
``fresh=True`` starts it in a new interpreter instead, for what only a new interpreter
shows (what it imports, its start-up); the server does so itself when a fork would not
be what ``python -m tether`` would be (``forked.Server.fresh_for``)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import forked
import httpx
from forked import Captured as Captured
from forked import Process as Process
from waiting import poll_until

ROOT = Path(__file__).resolve().parents[2]  # the repository
PYTHON = sys.executable
AGENT = "agents:agent"


def tether_env(url: str, **extra: str) -> dict[str, str]:
    """This process's environment without its ``TETHER_*``, on ``url``, with the test
    support on the path, a short heartbeat timeout and a generous notice window; then
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(
        {
            "TETHER_DATABASE_URL": url,
            "PYTHONPATH": str(ROOT / "tests" / "support"),
            "TETHER_HEARTBEAT_TIMEOUT_S": "0.3",
            # How long a process gives the webhook to take a notice: long enough that a
            # live process delivers every notice on a loaded machine (0.3 s lost one while
            # the tiers ran in parallel). A lost notice is re-issued only once this and the
            # heartbeat timeout passed, so a test about re-issues sets it short itself.
            "TETHER_NOTICE_TIMEOUT_S": "5",
            "TETHER_REAPER_INTERVAL_S": "3600",
        }
    )
    env.update(extra)
    return env


def spawn_agent(
    *args: str, agent: str, env: dict[str, str], log: Path, fresh: bool = False
) -> Process:
    """Start the ``tether`` CLI with ``agent`` (``module:factory``) in a new process; its
    output goes to ``log`` (a file, so a chatty long-running process never blocks on a
    full pipe)."""
    return forked.spawn([*args, "--agent", agent], env=env, cwd=ROOT, log=log, fresh=fresh)


def spawn(*args: str, env: dict[str, str], log: Path, fresh: bool = False) -> Process:
    """``spawn_agent`` with the test agent."""
    return spawn_agent(*args, agent=AGENT, env=env, log=log, fresh=fresh)


def start(*args: str, env: dict[str, str], agent: str = AGENT, fresh: bool = False) -> Captured:
    """Start the ``tether`` CLI with the test agent (or ``agent``) in a new process, its
    output captured (``communicate()``: a process that writes little)."""
    return forked.start([*args, "--agent", agent], env=env, cwd=ROOT, fresh=fresh)


def worker_until_idle(url: str, log: Path, *options: str, **env: str) -> int:
    """Run a ``tether worker --exit-when-idle`` (with ``options``) of the test agent playing
    the ``answer`` script (unless ``env`` names another) until it is idle or a failpoint
    exits it; its exit code (137 for a crash failpoint)."""
    environment = tether_env(url, **{"KIT_SCRIPT": "answer", **env})
    args = ("worker", "--exit-when-idle", *options)
    return spawn(*args, env=environment, log=log).wait(timeout=120)


def tether(
    *args: str,
    env: dict[str, str],
    timeout: float = 60,
    agent: str | None = AGENT,
    cwd: Path = ROOT,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the ``tether`` CLI in a new process with the test agent (or ``agent``; None: no
    ``--agent``, the demo's) in ``cwd``."""
    argv = [*args, "--agent", agent] if agent is not None else list(args)
    return forked.run(argv, env=env, cwd=cwd, timeout=timeout, fresh=fresh)


def pause_outside_a_write(proc: Process, url: str) -> None:
    """SIGSTOP ``proc`` (a worker on ``url``) at a moment it holds no SQLite write lock.

    A process paused inside a SQLite write transaction blocks every other process on the
    file (every transaction of the store begins IMMEDIATE), which is SQLite's nature, not
    the pause a test means (a worker frozen while its tool works). On SQLite the process is
    stopped, the file is tried for a write without waiting, and the process is let go and
    stopped again until the file is free; on PostgreSQL it is just stopped."""

    def stopped() -> bool:
        with open(f"/proc/{proc.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"

    def paused_unlocked() -> bool:
        proc.send_signal(signal.SIGSTOP)
        poll_until(stopped, what="the process stopped")
        if not url.startswith("sqlite"):
            return True
        probe = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return True
        except sqlite3.OperationalError:  # the write lock is held: let it finish the write
            proc.send_signal(signal.SIGCONT)
            return False
        finally:
            probe.close()

    poll_until(paused_unlocked, what="a pause outside a write")


def serve_ready(proc: Process, base: str, log: Path) -> bool:
    """Whether ``tether serve`` at ``base`` answers ``/readyz`` (it exited: fail, with the
    end of its ``log``)."""
    if proc.poll() is not None:
        raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` from the third (the state) on."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (read from ``/proc``: this kernel has no
    ``/proc/PID/task/TID/children``)."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended while we looked
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped)."""
    try:
        return _stat(pid)[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def log_lines(log: Path) -> list[dict[str, Any]]:
    """The JSON lines of a process's ``log`` (tether's structured log), others left out."""
    lines: list[dict[str, Any]] = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short, or another program's
    return lines
