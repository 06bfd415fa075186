"""A real PgBouncer in transaction pooling mode in front of one test database.

Debian's ``pgbouncer`` (``make test`` installs it) runs as a process of the test's own: its
ini and user list in a new folder under the system's temporary directory, a free port on
127.0.0.1, no Unix socket, ``pool_mode = transaction`` and ``auth_type = trust`` (the
machine's PostgreSQL trusts loopback connections, so the user list only names who may
connect). PgBouncer refuses to run as root: when the tests run as root it runs as the
``postgres`` OS user, which owns the folder. It is waited for until it answers a query
(never a bare sleep), and stopped and its folder removed on the way out, whatever
happened.

The admin console (the ``pgbouncer`` database) answers ``SHOW STATS`` and ``SHOW
SERVERS``: ``Bouncer.transactions`` proves a test's traffic went through the pooler, and
``Bouncer.server_pids`` tells its server connections from direct ones in
``pg_stat_activity``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from pgcluster import free_port
from waiting import poll_until

PGBOUNCER = "/usr/sbin/pgbouncer"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0


class Bouncer:
    """One PgBouncer serving ``database`` (the alias is the database's own name)."""

    def __init__(self, root: Path, direct_url: str, port: int) -> None:
        self.root = root
        self.direct_url = direct_url
        self.port = port
        parsed = sa.engine.make_url(direct_url)
        self.database = parsed.database or ""
        self.user = parsed.username or "postgres"
        self.log = root / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The database through the pooler, as a plain ``postgresql://`` URL."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def tether_url(self) -> str:
        """``url`` with what tells tether it is behind a transaction pooler."""
        return f"{self.url}?pool_mode=transaction"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """The rows of an admin console command (``SHOW STATS``, ``SHOW SERVERS``)."""
        dsn = f"postgresql://{self.user}@127.0.0.1:{self.port}/pgbouncer"
        # The console speaks the simple query protocol only, and has no transactions.
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            cur = conn.execute(command)
            names = [column.name for column in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def transactions(self) -> int:
        """The transactions the pooler has carried to the database so far."""
        rows = [r for r in self.admin("SHOW STATS") if r["database"] == self.database]
        return sum(int(r["total_xact_count"]) for r in rows)

    def server_pids(self) -> set[int]:
        """The PostgreSQL backends of the pooler's server connections (open now)."""
        return {int(r["remote_pid"]) for r in self.admin("SHOW SERVERS") if r["remote_pid"]}

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _ini(bouncer: Bouncer, host: str, port: int, pool_size: int, ignore: str) -> str:
    return "\n".join(
        (
            "[databases]",
            f"{bouncer.database} = host={host} port={port} dbname={bouncer.database}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {bouncer.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {bouncer.root / 'userlist.txt'}",
            f"admin_users = {bouncer.user}",
            "pool_mode = transaction",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 500",
            f"ignore_startup_parameters = {ignore}",
            f"pidfile = {bouncer.root / 'pgbouncer.pid'}",
            "",
        )
    )


def _answers(bouncer: Bouncer) -> bool:
    """Whether the pooler answers a query through to the database (it exited: raise)."""
    assert bouncer.proc is not None
    if bouncer.proc.poll() is not None:
        raise RuntimeError(
            f"pgbouncer exited with {bouncer.proc.returncode}:\n{bouncer.log_tail()}"
        )
    try:
        with psycopg.connect(bouncer.url, connect_timeout=2, prepare_threshold=None) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def _wait_until_answering(bouncer: Bouncer) -> None:
    try:
        poll_until(lambda: _answers(bouncer), timeout=START_DEADLINE_S, what="pgbouncer answering")
    except AssertionError as exc:
        raise RuntimeError(f"{exc}\n{bouncer.log_tail()}") from exc


@contextmanager
def pgbouncer(
    direct_url: str, *, pool_size: int = 5, ignore_startup_parameters: str = ""
) -> Iterator[Bouncer]:
    """A running PgBouncer in transaction mode in front of ``direct_url``'s database, with
    at most ``pool_size`` server connections; stopped and deleted on exit.
    ``ignore_startup_parameters`` is PgBouncer's own setting (e.g. ``options``: what a
    client without tether's pooler mode would need to connect at all)."""
    if not Path(PGBOUNCER).exists():
        raise RuntimeError(f"{PGBOUNCER} is missing: `make test` installs Debian's pgbouncer")
    root = Path(tempfile.mkdtemp(prefix="tether-pgbouncer-"))
    bouncer = Bouncer(root, direct_url, free_port())
    server = sa.engine.make_url(direct_url)
    try:
        (root / "userlist.txt").write_text(f'"{bouncer.user}" ""\n')
        (root / "pgbouncer.ini").write_text(
            _ini(
                bouncer,
                server.host or "127.0.0.1",
                server.port or 5432,
                pool_size,
                ignore_startup_parameters,
            )
        )
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:  # PgBouncer will not run as root
            owner = pwd.getpwnam("postgres")
            for path in (root, *root.iterdir()):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            run_as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        root.chmod(0o700)
        with bouncer.log.open("wb") as sink:
            bouncer.proc = subprocess.Popen(
                [PGBOUNCER, str(root / "pgbouncer.ini")],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=root,
                **run_as,
            )
        _wait_until_answering(bouncer)
        yield bouncer
    finally:
        if bouncer.proc is not None and bouncer.proc.poll() is None:
            bouncer.proc.terminate()  # SIGTERM: PgBouncer's immediate shutdown
            try:
                bouncer.proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                bouncer.proc.kill()
                bouncer.proc.wait(timeout=STOP_DEADLINE_S)
        shutil.rmtree(root, ignore_errors=True)
