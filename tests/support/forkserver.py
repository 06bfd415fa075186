"""``tether`` CLI processes for the tests, started by a fork server: an interpreter that has
imported once what a ``python -m tether`` process imports (Typer, Rich, SQLAlchemy,
pydantic, the engine, the store's drivers, the HTTP layer, the model SDKs: 0.6 s of CPU a
process) and forks a child for each process a test asks for.

A child is a real process of its own, started as ``python -m tether`` would be: it closes
the server's descriptors, takes back the signal handlers a fresh interpreter has, takes
exactly the environment, working directory, ``sys.path`` (the directory, then
``PYTHONPATH``), ``sys.argv`` and standard streams asked for (stdin ``/dev/null``), runs
``tether/__main__.py`` and exits through the interpreter's own exit (its atexit handlers
and buffered output as in a fresh process; a crash failpoint's ``os._exit(137)`` still
exits hard). The server, one per pytest process, is a fresh interpreter started on first
use (``python forkserver.py FD``, so the pytest process never forks); it starts no thread
and no event loop, reaps its children and reports each one's end (an exit code, or minus
the signal, as ``Popen.returncode`` says it) to the test's ``Forked``.

What a fork cannot give is left to a fresh interpreter, never changed silently: a process
whose environment differs from the server's in what the interpreter reads at start-up
(``PYTHON*`` but the path and bytecode, ``LANG``, ``LC_*``) or what the server's imports
read (``COLUMNS`` for Rich's consoles, ``FORCE_COLOR``, ``HOME``...: recorded while it
imported), or whose directory or ``PYTHONPATH`` holds a module of a name the server
imported, is started fresh (``subprocess``), as is one a caller asks ``fresh`` for. A
server that dies fails every process it was asked for, saying so."""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# What the ``tether`` command imports, whichever command it is: the CLI, the commands'
# own imports (the worker and its loop, uvloop; the API; the store's backends and drivers;
# uvicorn), the model SDKs. Not OpenTelemetry (a process imports it only when it exports: with it
# loaded, tether's tracing takes its other path), not MCP (it imports OpenTelemetry), not
# the tests' support modules (small, and a test may shadow them).
PRELOAD = (
    "tether.cli.app",
    "tether.cli.serving",
    "tether.cli.wiring",
    "tether.cli.supervisor",
    "tether.store.backend.sqlite",
    "tether.store.backend.postgres",
    "psycopg",
    "sqlalchemy.dialects.postgresql.psycopg",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "tether.webhook",
    "tether.api.app",
    "tether.api.server",
    "uvicorn",
    "uvloop",
    "tether.models.openai",
    "tether.models.anthropic",
    "tether.models.gemini",
)
# Environment variables the interpreter reads as it starts; a child takes these two from
# its own environment (``sys.path``, ``sys.dont_write_bytecode``).
PER_CHILD = frozenset({"PYTHONPATH", "PYTHONDONTWRITEBYTECODE"})
# Whole copies of the environment made at import that no command reads back:
# ``wsgiref.handlers.os_environ`` (refreshed in each child all the same) and the one
# ``platform`` hands the ``file`` command it runs.
COPIERS = (os.sep + os.path.join("wsgiref", "handlers.py"), os.sep + "platform.py")
START_TIMEOUT_S = 120
MAX_MESSAGE = 1 << 20


def at_startup(name: str) -> bool:
    """Whether the interpreter reads environment variable ``name`` as it starts."""
    python = name.startswith("PYTHON") and name not in PER_CHILD
    return python or name == "LANG" or name.startswith("LC_")


class ForkServerError(RuntimeError):
    """The fork server could not start a process, or died with processes in its care."""


# -- the messages: one JSON object a datagram, with the descriptors it passes ---------------


def send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise ForkServerError(f"a fork server message of {len(data)} bytes is too long")
    socket.send_fds(sock, [data], list(fds))


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and its descriptors; None at the end of the stream."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise ForkServerError("a fork server message was cut short")
    return (json.loads(data) if data else None), fds


# -- the server ---------------------------------------------------------------------------


@dataclass
class Request:
    """A process to become: its arguments (after ``tether``), environment, directory and
    standard streams (descriptors), and what of the server's a child closes."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]
    closing: list[int]
    interrupt: Any  # SIGINT's handler as the interpreter set it
    base: list[str]  # the interpreter's own sys.path (after the script's directory)


def _caller_file() -> str:
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.endswith(
        ("os>", "os.py", "_collections_abc>", "_collections_abc.py")
    ):
        frame = frame.f_back
    return frame.f_code.co_filename


def preload() -> dict[str, str | None]:
    """Import ``PRELOAD``; the environment variables read meanwhile (``os.environ[...]``,
    ``.get``, ``in``, ``os.getenv``), with their values (None: unset)."""
    read: dict[str, str | None] = {}
    plain: Any = type(os.environ)

    def getitem(self: Any, key: str) -> str:
        try:
            value: str | None = plain.__getitem__(self, key)
        except KeyError:
            value = None
        if not _caller_file().endswith(COPIERS):
            read[key] = value
        if value is None:
            raise KeyError(key)
        return value

    os.environ.__class__ = type("Recording", (plain,), {"__getitem__": getitem})
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        os.environ.__class__ = plain
    return read


def serve(sock: socket.socket) -> Request | None:
    """Preload, then fork a child per request until the test process goes: None in the
    server then, the request in a child. No ``with`` or ``finally`` here: a child leaves
    this function by returning."""
    interrupt = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends pytest, and so the server
    base = sys.path[1:]
    sys.path[:] = [str(ROOT), str(HERE), *base]  # as in a child of the tests, mostly
    read = preload()
    gc.freeze()  # what every child shares is never written by their collections
    wake, woken = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(woken)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes `select`
    top = sorted({name.partition(".")[0] for name in sys.modules})
    send(sock, {"ready": os.getpid(), "read": read, "top": top})
    while True:
        readable, _, _ = select.select([sock, wake], [], [])
        if wake in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake, 512):
                    pass
            _reap(sock)
        if sock not in readable:
            continue
        message, fds = receive(sock)
        if message is None:
            return None
        closing = [wake, woken]
        if not _fork(sock, message, fds):  # in the child
            sock.close()
            argv, env, cwd = message["argv"], message["env"], message["cwd"]
            return Request(argv, env, cwd, fds, closing, interrupt, base)


def _fork(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> bool:
    """Fork a child for ``message``: True in the server (the child reported), False in
    the child."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        send(sock, {"id": message["id"], "error": f"the server has {len(threads)} threads"})
        return True
    pid = os.fork()
    if pid == 0:
        return False
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)  # before it can be reaped: names this process only
    send(sock, {"id": message["id"], "pid": pid}, [pidfd])
    os.close(pidfd)
    return True


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, {"pid": pid, "status": os.waitstatus_to_exitcode(status)})


def search_path(env: Mapping[str, str], cwd: str, base: Sequence[str]) -> list[str]:
    """``sys.path`` of ``python -m`` in ``cwd`` with ``env``: the directory, then each of
    ``PYTHONPATH`` made absolute, then ``base``, without repeats but the first (``site``)."""
    entries = env.get("PYTHONPATH", "").split(os.pathsep) if env.get("PYTHONPATH") else []
    path: list[str] = []
    for entry in [os.path.join(cwd, entry) for entry in entries] + list(base):
        entry = os.path.normpath(entry)
        if entry not in path:
            path.append(entry)
    return [cwd, *path]


def become(request: Request) -> None:
    """In a child: become ``python -m tether ARGV`` as asked, and run it."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, request.interrupt)
    for fd in request.closing:
        os.close(fd)
    for target, fd in enumerate(request.fds):
        os.dup2(fd, target)
    for fd in set(request.fds):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    sys.path[:] = search_path(request.env, os.getcwd(), request.base)
    sys.dont_write_bytecode = bool(request.env.get("PYTHONDONTWRITEBYTECODE"))
    importlib.invalidate_caches()
    handlers: Any = sys.modules.get("wsgiref.handlers")
    if handlers is not None:
        handlers.os_environ = handlers.read_environ()
    if isinstance(sys.stdout, io.TextIOWrapper):  # as the interpreter opens it
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
    main = importlib.util.find_spec("tether.__main__")
    assert main is not None and main.origin is not None
    sys.argv = [main.origin, *request.argv]
    sys.orig_argv = [sys.executable, "-m", "tether", *request.argv]
    runpy.run_module("tether", run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # the server: python forkserver.py FD
    _request = serve(socket.socket(fileno=int(sys.argv[1])))
    if _request is not None:
        become(_request)  # a child: SystemExit ends it as it ends `python -m tether`
