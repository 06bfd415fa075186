"""``tether serve`` and its process's limit of open files, as a real process: it raises its
soft limit to the hard one as it starts, and out of descriptors (a flood of connections
under a hard limit it cannot raise) it says so in one line, not one per connection it
failed to accept (asyncio's own report made 78 MB of log in 30 s), and serves again once
the connections are gone."""

from __future__ import annotations

import resource
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import processes
from waiting import poll_until

DEADLINE_S = 60  # a bound, never a measurement
FLOODED = "connections cannot be accepted"
ASYNCIO_SAYS = "socket.accept() out of system resource"  # once per failed accept


@contextmanager
def serving(
    url: str, log: Path, soft: int, hard: int
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``tether serve`` (the API alone) started with open-files limits ``soft``/``hard``;
    a header timeout far away, so a connection that sends nothing is held."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = processes.tether_env(url, TETHER_HTTP_HEADER_TIMEOUT_S="3600")
    command = ["serve", "--port", str(port), "--workers", "0", "--agent", processes.AGENT]

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with log.open("a") as sink:
        proc = subprocess.Popen(
            [processes.PYTHON, "-m", "tether", *command],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=processes.ROOT,
            preexec_fn=limited,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        poll_until(lambda: processes.serve_ready(proc, base, log), timeout=DEADLINE_S)
        yield proc, base
    finally:
        proc.kill()
        proc.wait(timeout=DEADLINE_S)


def open_files_limit(pid: int) -> tuple[int, int]:
    """The soft and hard limits of open files of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line in /proc/PID/limits")


def test_serve_raises_its_soft_limit_of_open_files_to_the_hard_one(
    sqlite_url: str, tmp_path: Path
) -> None:
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    log = tmp_path / "serve.log"
    with serving(sqlite_url, log, 256, hard) as (proc, _):
        assert open_files_limit(proc.pid) == (hard, hard)
    started = next(line for line in log.read_text().splitlines() if '"msg": "serving"' in line)
    assert f'"open_files": {hard}' in started and '"open_files_before": 256' in started


def test_out_of_descriptors_serve_logs_one_line_not_one_per_connection(
    sqlite_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    with serving(sqlite_url, log, 96, 96) as (_, base), ExitStack() as held:
        host, port = base.removeprefix("http://").split(":")

        def flooded() -> bool:  # idle connections, each held by the server's descriptor
            for _ in range(20):
                held.enter_context(socket.create_connection((host, int(port)), timeout=10))
            text = log.read_text()
            return FLOODED in text or ASYNCIO_SAYS in text

        poll_until(flooded, timeout=DEADLINE_S, what="serve to run out of descriptors")
        held.close()  # the clients go: their descriptors come back

        def serving_again() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        poll_until(serving_again, timeout=DEADLINE_S, what="serve to accept again")
    lines = log.read_text().splitlines()
    assert len([line for line in lines if ASYNCIO_SAYS in line]) == 0
    assert 1 <= len([line for line in lines if FLOODED in line]) <= 10, len(lines)
