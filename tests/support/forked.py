"""The test process's side of the fork server (``forkserver.py``): ``run``, ``spawn`` and
``start`` a ``tether`` command, forked by the server, or in a fresh interpreter when a fork
cannot be what ``python -m tether`` would be (or the caller says ``fresh``); ``Forked``,
such a process as the tests see a ``subprocess.Popen``.

The server is started on first use, one per pytest process, and stopped at exit. One
thread reads what it says (each process started, each process's end); a process's
signals go through a pidfd (so never to a pid reused after the server reaped it)."""

from __future__ import annotations

import atexit
import collections
import contextlib
import locale
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import forkserver
from forkserver import ForkServerError

# The server's environment: this process's as its tests were collected (before a test
# changed it), so that it is the same whichever test starts the server.
BASELINE = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
# Why processes were started fresh rather than forked, and how many (``most_common()``).
fallbacks: collections.Counter[str] = collections.Counter()
Outputs = tuple[IO[bytes], IO[bytes]]


class Process(Protocol):
    """What the tests use of a process: ``subprocess.Popen``'s and ``Forked``'s."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class Captured(Process, Protocol):
    """A process whose output was captured: its stdout and stderr once it ended."""

    def communicate(self, *, timeout: float | None = None) -> tuple[str, str]: ...


def _text(data: bytes) -> str:
    """Output as ``subprocess.run(text=True)`` decodes it."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


class Forked:
    """A process the fork server started, with what the tests use of ``Popen``: its
    ``returncode`` (minus the signal that killed it) once the server reaped it."""

    def __init__(
        self, server: Server, pid: int, pidfd: int, args: list[str], captured: Outputs | None
    ) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._server = server
        self._pidfd: int | None = pidfd  # signals reach this process, never a reused pid
        self._captured = captured
        self._output: tuple[str, str] | None = None

    def ended(self, code: int) -> None:
        """The server reaped it (called with the server's lock held)."""
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _wait(self, timeout: float | None) -> int | None:
        changed = self._server.changed
        with changed:
            changed.wait_for(lambda: self.returncode is not None or self._server.dead, timeout)
            if self.returncode is None and self._server.dead:
                raise ForkServerError(f"process {self.pid}'s end is unknown: {self._server.dead}")
            return self.returncode

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        with self._server.changed:
            if self._pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, *, timeout: float | None = None) -> tuple[str, str]:
        """Its stdout and stderr, once it ended (started with them captured)."""
        self.wait(timeout)
        if self._output is None:
            assert self._captured is not None, "its output went to a log"
            read = []
            for sink in self._captured:
                sink.seek(0)
                read.append(_text(sink.read()))
                sink.close()
            self._output = (read[0], read[1])
        return self._output


class Server:
    """The fork server, seen from the test process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()  # what the server itself says (its stderr)
        self.proc = subprocess.Popen(
            [sys.executable, forkserver.__file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            cwd=forkserver.ROOT,
            env=BASELINE,
        )
        theirs.close()
        self.sock = ours
        self.null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        ours.settimeout(forkserver.START_TIMEOUT_S)
        try:
            ready, _ = forkserver.receive(ours)
            if ready is None:
                raise ForkServerError("it closed its end")
        except (OSError, ValueError, ForkServerError) as exc:
            self.proc.kill()
            self.proc.wait()
            raise ForkServerError(f"the fork server did not start ({exc}): {self.said()}") from exc
        ours.settimeout(None)
        self.read: dict[str, str | None] = ready["read"]
        self.top = frozenset(ready["top"])
        self.dead = ""  # why it is gone, once it is
        self.changed = threading.Condition()
        self.sending = threading.Lock()
        self.count = 0
        self.pending: dict[int, tuple[list[str], Outputs | None]] = {}
        self.started: dict[int, Forked | str] = {}
        self.running: dict[int, Forked] = {}
        self.listener = threading.Thread(target=self._listen, name="forkserver", daemon=True)
        self.listener.start()

    def said(self) -> str:
        """The end of what the server wrote to its stderr."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:] or "(nothing)"

    def fresh_for(self, env: Mapping[str, str], cwd: str) -> str | None:
        """Why a process with ``env`` in ``cwd`` needs a fresh interpreter, if it does."""
        names = {name for name in {*env, *BASELINE} if forkserver.at_startup(name)}
        started = [name for name in names if env.get(name) != BASELINE.get(name)]
        if started:
            return f"the interpreter reads {min(started)} as it starts"
        imported = [name for name, value in self.read.items() if env.get(name) != value]
        if imported:
            return f"the server's imports read {min(imported)}"
        for directory in forkserver.search_path(env, cwd, ()):
            with contextlib.suppress(OSError):
                for entry in os.listdir(directory):
                    name, dot, suffix = entry.partition(".")
                    if name not in self.top:
                        continue
                    package = os.path.isfile(os.path.join(directory, entry, "__init__.py"))
                    if package or suffix == "py" or (dot and suffix.endswith("so")):
                        return f"{directory} holds a module named {name}"
        return None

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        outputs: Outputs,
        *,
        captured: bool,
    ) -> Forked:
        """A child of the server running ``tether ARGV``, its stdout and stderr to
        ``outputs`` (files the ``Forked`` reads back when ``captured``)."""
        fds = [outputs[0].fileno(), outputs[1].fileno()]
        args = [sys.executable, "-m", "tether", *argv]
        with self.changed:
            if self.dead:
                raise ForkServerError(f"{self.dead}: cannot start {args}")
            self.count += 1
            key = self.count
            self.pending[key] = (args, outputs if captured else None)
        message = {"id": key, "argv": list(argv), "env": dict(env), "cwd": cwd}
        with self.sending:
            forkserver.send(self.sock, message, [self.null, *fds])
        with self.changed:
            self.changed.wait_for(
                lambda: key in self.started or bool(self.dead), forkserver.START_TIMEOUT_S
            )
            started = self.started.pop(key, None)
        if isinstance(started, Forked):
            return started
        raise ForkServerError(f"{started or self.dead or 'no answer'}: cannot start {args}")

    def _listen(self) -> None:
        reason = "it closed its end"
        try:
            while True:
                message, fds = forkserver.receive(self.sock)
                if message is None:
                    break
                with self.changed:
                    self._take(message, fds)
                    self.changed.notify_all()
        except Exception as exc:  # whatever it is, every wait on a process says it
            reason = f"reading it failed: {exc!r}"
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        with self.changed:
            ended = f"exit {self.proc.poll()}"
            self.dead = f"the fork server is gone ({reason}, {ended}): {self.said()}"
            self.changed.notify_all()

    def _take(self, message: dict[str, Any], fds: list[int]) -> None:
        if "status" in message:
            forked = self.running.pop(message["pid"], None)
            if forked is not None:
                forked.ended(message["status"])
            return
        key = message["id"]
        args, captured = self.pending.pop(key)
        if "error" in message:
            self.started[key] = message["error"]
            return
        forked = Forked(self, message["pid"], fds[0], args, captured)
        self.running[forked.pid] = forked
        self.started[key] = forked

    def stop(self) -> None:
        """End the server (its children go on as orphans, as ``Popen``'s would)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.listener.join(timeout=30)
        if not self.listener.is_alive():
            self.sock.close()
        os.close(self.null)
        self.log.close()


_lock = threading.Lock()
_server: Server | None = None


def server() -> Server:
    """The fork server of this process, started on first use."""
    global _server
    with _lock:
        if _server is None:
            _server = Server()
            atexit.register(_server.stop)
        return _server


def _forking(env: Mapping[str, str], cwd: Path, fresh: bool) -> Server | None:
    """The server to fork the process from, or None for a fresh interpreter."""
    if fresh:
        return None
    found = server()
    reason = found.fresh_for(env, str(cwd))
    if reason is None:
        return found
    fallbacks[reason] += 1
    return None


def run(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, tether, *argv], capture_output=True, text=True)``."""
    command = [sys.executable, "-m", "tether", *argv]
    found = _forking(env, cwd, fresh)
    if found is None:
        return subprocess.run(
            command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    outputs = (tempfile.TemporaryFile(), tempfile.TemporaryFile())
    proc = found.start(argv, env, str(cwd), outputs, captured=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(command, timeout, out, err) from None
    return subprocess.CompletedProcess(command, proc.wait(), out, err)


def start(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, fresh: bool = False
) -> Captured:
    """``tether ARGV`` started, its stdout and stderr captured."""
    found = _forking(env, cwd, fresh)
    if found is None:
        return _Piped([sys.executable, "-m", "tether", *argv], env=env, cwd=cwd)
    outputs = (tempfile.TemporaryFile(), tempfile.TemporaryFile())
    return found.start(argv, env, str(cwd), outputs, captured=True)


def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log: Path, fresh: bool = False
) -> Process:
    """``tether ARGV`` started, its stdout and stderr appended to ``log``."""
    found = _forking(env, cwd, fresh)
    with log.open("ab") as sink:
        if found is None:
            command = [sys.executable, "-m", "tether", *argv]
            return subprocess.Popen(command, env=env, cwd=cwd, stdout=sink, stderr=sink)
        return found.start(argv, env, str(cwd), (sink, sink), captured=False)


class _Piped(subprocess.Popen[str]):
    """A fresh ``tether`` process with its output captured, as ``Captured`` says."""

    def __init__(self, command: list[str], *, env: Mapping[str, str], cwd: Path) -> None:
        super().__init__(
            command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def communicate(
        self, input: str | None = None, timeout: float | None = None
    ) -> tuple[str, str]:
        out, err = super().communicate(input, timeout)
        return out or "", err or ""
