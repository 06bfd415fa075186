"""A throwaway PostgreSQL cluster for one test, which the test may stop and start.

``initdb`` into a new folder under the system's temporary directory (owned by the
``postgres`` OS user when the tests run as root, since PostgreSQL refuses to run as
root), trust authentication, a free port on 127.0.0.1 and its socket in that folder. The
machine's own cluster (port 5432) is never touched. The cluster is stopped and its
folder removed on the way out, whatever happened.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER_SETTINGS = (
    "-c listen_addresses=127.0.0.1",
    "-c max_connections=300",
    # A test cluster: durability across an OS crash is not needed, speed is.
    "-c fsync=off",
    "-c full_page_writes=off",
)


def bindir() -> Path:
    """The binaries of the newest PostgreSQL installed (Debian's layout)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name.split(".")[0]),
    )
    if not found:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgCluster:
    """One cluster in ``root``; ``url`` reaches its ``postgres`` database."""

    def __init__(self, root: Path, bin_dir: Path) -> None:
        self.root = root
        self.bin_dir = bin_dir
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:  # PostgreSQL will not run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)

    def _check(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed ({result.returncode}): {result.stdout[-2000:]}"
                f"{result.stderr[-2000:]}\n{self.log_tail()}"
            )

    def init(self) -> None:
        result = self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip
        self._check(result, "initdb")

    def start(self) -> None:
        """Start the server and wait until it accepts connections (on a new free port if
        another process took ours meanwhile, only before the first start)."""
        options = " ".join((f"-p {self.port}", f"-k {self.root}", *SERVER_SETTINGS))
        result = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", "90", "start",
        )  # fmt: skip
        self._check(result, "pg_ctl start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back and disconnect every session) and wait."""
        self._check(
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "90", "stop"),
            f"pg_ctl stop -m {mode}",
        )

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    """A running throwaway cluster; stopped and deleted on exit."""
    root = Path(tempfile.mkdtemp(prefix="tether-pg-"))
    cluster = PgCluster(root, bindir())
    try:
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(root, owner.pw_uid, owner.pw_gid)
        root.chmod(0o700)
        cluster.init()
        for attempt in range(3):
            try:
                cluster.start()
                break
            except RuntimeError:
                if attempt == 2 or cluster.running():
                    raise
                cluster.port = free_port()  # the free port was taken meanwhile
        yield cluster
    finally:
        try:
            if cluster.data.exists() and cluster.running():
                cluster.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)
