"""``tether worker --processes N``: a supervisor of N worker processes, so that a machine's
cores all carry runs (one process runs its Python on one core).

Each process it starts is the ordinary ``tether worker`` (``--processes 1``) with the same
options and environment, its output on the supervisor's; the supervisor carries no run
and, once its start-up check is done (``wiring.check_worker_start``), touches no database.
A process that exits while the supervisor is not stopping is logged and started again
after a backoff (0.5 s doubling to 30 s, from 0.5 s again once a process had lived longer
than that); under ``--exit-when-idle`` one that exits 0 is done. SIGTERM or SIGINT is
passed on to every process as SIGTERM (each hands its runs back at its next step
boundary); the supervisor exits once all have, 0 unless one of them exited otherwise.

A process started here ends with the supervisor, however the supervisor ends: on Linux it
asks the kernel for SIGTERM when its parent dies (``follow_supervisor``), so a supervisor
killed with SIGKILL leaves no worker behind, and each hands its runs back as on SIGTERM.

Imports nothing of the engine: ``follow_supervisor`` runs at the start of every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

# The most processes one supervisor starts: a guard against a typo, not a tuning.
MAX_PROCESSES = 256
# What a process the supervisor starts finds in its environment: the supervisor's pid (it
# ends when that process does) and its own index, 1 to N, which its log lines carry.
SUPERVISOR_ENV = "TETHER_SUPERVISOR_PID"
INDEX_ENV = "TETHER_WORKER_PROCESS"
# A process that exited is started again after RESTART_FIRST_S, doubling up to
# RESTART_MAX_S; one that had lived longer than RESTART_MAX_S starts again at the first.
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
# prctl(2): the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's."""
    counted = getattr(os, "process_cpu_count", None)  # Python 3.13
    if counted is not None:
        return int(counted() or 1)
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def process_count(text: str) -> int:
    """``--processes``: an integer from 1 to ``MAX_PROCESSES``, or ``auto`` (one per core,
    at most ``MAX_PROCESSES``); ValueError naming what is accepted otherwise."""
    if text.strip().lower() == "auto":
        return min(cores(), MAX_PROCESSES)
    accepted = f"an integer from 1 to {MAX_PROCESSES}, or auto (one per core)"
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not {accepted}") from None
    if not 1 <= count <= MAX_PROCESSES:
        raise ValueError(f"{count} is not {accepted}")
    return count


def supervise(worker_args: Sequence[str], count: int, *, exit_when_idle: bool) -> int:
    """Run ``count`` processes of ``tether worker`` with ``worker_args`` until stopped (or,
    with ``exit_when_idle``, until each has exited 0); the supervisor's exit status."""
    return asyncio.run(Supervisor(worker_args, count, exit_when_idle=exit_when_idle).run())


class Supervisor:
    """Keeps ``count`` worker processes running; ``stop()`` passes SIGTERM on to them."""

    def __init__(self, worker_args: Sequence[str], count: int, *, exit_when_idle: bool) -> None:
        self.command = [sys.executable, "-m", "tether", "worker", *worker_args]
        self.count = count
        self.exit_when_idle = exit_when_idle
        self.stopping = asyncio.Event()
        self.children: dict[int, asyncio.subprocess.Process] = {}  # by index, while alive

    async def run(self) -> int:
        """Start the processes and keep them until stopped; 0 when each process running at
        the stop exited 0, else 1."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        log.info(
            "supervising worker processes",
            extra={"action": "supervise", "processes": self.count, "pid": os.getpid()},
        )
        try:
            ends = await asyncio.gather(*(self._keep(i) for i in range(1, self.count + 1)))
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        # A process killed by the SIGTERM passed on had not yet set its handlers: it held
        # no run. Any other end (an error, a SIGKILL) is the supervisor's failure too.
        failed = [code for code in ends if code not in (0, -signal.SIGTERM)]
        log.info(
            "worker processes stopped",
            extra={"action": "supervise", "processes": self.count, "failed": len(failed)},
        )
        return 1 if failed else 0

    def stop(self) -> None:
        """Stop restarting processes and pass SIGTERM on to each one alive. Idempotent: a
        second signal passes it on again, which changes nothing for a process that is
        already handing its runs back."""
        self.stopping.set()
        for proc in list(self.children.values()):
            _terminate(proc)

    async def _keep(self, index: int) -> int:
        """Keep process ``index`` running until the stop (or, with ``exit_when_idle``,
        until it exits 0); its exit code then (0 when none was running at the stop)."""
        delay = RESTART_FIRST_S
        while True:
            began = time.monotonic()
            pid, code = await self._run_once(index)
            ended = _ended(index, pid, code)
            if self.stopping.is_set() or (code == 0 and self.exit_when_idle):
                log.info("worker process exited", extra=ended)
                return code
            if time.monotonic() - began > RESTART_MAX_S:
                delay = RESTART_FIRST_S  # it had been healthy: a fresh failure
            log.error("worker process exited; restarting", extra={**ended, "retry_in_s": delay})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=delay)
            if self.stopping.is_set():
                return 0
            delay = min(delay * 2, RESTART_MAX_S)

    async def _run_once(self, index: int) -> tuple[int | None, int]:
        """Start process ``index`` and wait for it to exit: its pid and exit code (1, with
        no pid, when it could not be started)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command, env=self._env(index), stdin=subprocess.DEVNULL
            )
        except OSError as exc:  # no memory, no more processes: tried again after a backoff
            log.error(
                "starting a worker process failed",
                extra={
                    "action": "worker_process_start",
                    "worker_process": index,
                    "error": repr(exc),
                },
            )
            return None, 1
        self.children[index] = proc
        if self.stopping.is_set():  # the stop came while it was being started
            _terminate(proc)
        log.info(
            "worker process started",
            extra={"action": "worker_process_start", "worker_process": index, "pid": proc.pid},
        )
        try:
            return proc.pid, await proc.wait()
        finally:
            del self.children[index]

    def _env(self, index: int) -> dict[str, str]:
        return {**os.environ, SUPERVISOR_ENV: str(os.getpid()), INDEX_ENV: str(index)}


def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to ``proc`` unless it is known to have exited. ``os.kill``, not
    ``send_signal``: that polls the process, which could reap it before asyncio's child
    watcher does, and asyncio would then report its exit code as 255."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)


def _ended(index: int, pid: int | None, code: int) -> dict[str, object]:
    """The fields of the log line of a process that exited: its exit code, or the signal
    that ended it."""
    fields: dict[str, object] = {
        "action": "worker_process_exit",
        "worker_process": index,
        "pid": pid,
    }
    if code >= 0:
        return {**fields, "exit_code": code}
    try:
        return {**fields, "signal": signal.Signals(-code).name}
    except ValueError:  # a signal Python has no name for
        return {**fields, "signal": str(-code)}


def follow_supervisor() -> None:
    """In a worker process a supervisor started (its environment names the supervisor):
    its log lines carry its index (``worker_process``), and it ends with the supervisor.
    On Linux the kernel sends it SIGTERM when the supervisor dies, so it hands its runs
    back as a stopped worker does; a supervisor that died before that was asked for is
    seen here (the parent is another process), and the worker exits 0 before it starts.
    The variables are taken out of the environment, so that no process this one starts
    takes the supervisor for its own."""
    supervisor = os.environ.pop(SUPERVISOR_ENV, None)
    index = os.environ.pop(INDEX_ENV, None)
    if supervisor is None:
        return
    from tether.telemetry.logs import stamp

    if index is not None:
        stamp(worker_process=int(index))
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning(
                "could not ask to end with the supervisor",
                extra={"action": "supervised", "errno": ctypes.get_errno()},
            )
    if os.getppid() != int(supervisor):
        log.warning("the supervisor is gone; exiting", extra={"action": "supervised"})
        raise SystemExit(0)
