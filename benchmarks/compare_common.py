"""What every system of ``compare.py`` shares: the workload, the databases, the counters.

The workload: a scripted "model" asks for one read-only tool call (``fetch``) per step for
N-1 steps, then answers (N steps in all). Step ``n``'s tool result carries a distinct,
incompressible payload: 6,144 random bytes from an RNG seeded with ``n``, base64-encoded to
8,192 characters. Every system gets the same turns and the same payloads, and stores them
its own way.

Nothing here imports tether or a peer: the parent process and every child use it.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
PG_ADMIN_URL = f"{PG_SERVER}/postgres"
RANDOM_BYTES = 6144  # base64: 8,192 characters of tool result per step
SYSTEM_PROMPT = "You fetch records."
WARMUP_STEPS = 3
NEVER = 10**6  # a step count no run reaches: the model of a resumable run never answers
ANSWER = "done"


# -- the workload ------------------------------------------------------------------------


@cache
def payload(n: int) -> str:
    """Step ``n``'s incompressible payload: 8,192 base64 characters, different each step."""
    return base64.b64encode(random.Random(n).randbytes(RANDOM_BYTES)).decode("ascii")


def tool_result(n: int) -> dict[str, Any]:
    """What ``fetch(n)`` returns."""
    return {"n": n, "data": payload(n)}


def tool_text(n: int) -> str:
    """The tool result as text (for the systems whose tool message holds a string)."""
    return json.dumps(tool_result(n), separators=(",", ":"))


def question(steps: int) -> str:
    return f"Fetch {steps} pages of records."


def call_id(n: int) -> str:
    return f"call_{n}"


def wants_tool(assistant_turns: int, steps: int) -> bool:
    """The scripted model: with ``assistant_turns`` turns already in the history, a run of
    ``steps`` steps asks for ``fetch(assistant_turns)`` until its last step, then answers."""
    return assistant_turns < steps - 1


def assistant_turn(assistant_turns: int, steps: int) -> dict[str, Any]:
    """The next assistant message, in OpenAI chat format."""
    if not wants_tool(assistant_turns, steps):
        return {"role": "assistant", "content": ANSWER}
    n = assistant_turns
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id(n),
                "type": "function",
                "function": {"name": "fetch", "arguments": json.dumps({"n": n})},
            }
        ],
    }


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One timed run on a fresh database."""

    system: str
    backend: str
    steps: int
    seconds: float  # wall time of the whole run, its start and its answer included
    stored_bytes: int  # what the run added to the database
    check: str  # "ok", or why the stored run does not hold every step

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        return cls(**data)

    @classmethod
    def checked(
        cls, system: str, db: Database, steps: int, seconds: float, stored: int, failures: list[str]
    ) -> Sample:
        """A run's sample, its stored-check the verdict of ``failures``."""
        return cls(
            system=system,
            backend=db.backend,
            steps=steps,
            seconds=seconds,
            stored_bytes=stored,
            check=verdict(failures),
        )


@dataclass(frozen=True, kw_only=True)
class Resumed:
    """One resumption of a stored run in a fresh process."""

    system: str
    backend: str
    seconds: float  # from opening the system on the stored run to its next step stored
    check: str
    # Of ``seconds``, the time before the system began to execute the resumed run, where
    # it shows (DBOS: recovery re-enqueues the workflow and a queue poller picks it up).
    waited: float = math.nan

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Resumed:
        return cls(**data)


def verdict(failures: list[str]) -> str:
    return "ok" if not failures else "; ".join(failures)


def expect(failures: list[str], what: str, got: object, want: object) -> None:
    """Record a failure unless ``got == want``."""
    if got != want:
        failures.append(f"{what}: {got!r}, expected {want!r}")


def expect_result(failures: list[str], stored: str | bytes | None, n: int) -> None:
    """Record a failure unless ``stored`` (a stored tool message, in whatever encoding keeps
    the payload's text) holds step ``n``'s payload."""
    text = stored.decode("latin-1") if isinstance(stored, bytes) else stored
    if text is None or payload(n) not in text:
        failures.append(f"the tool result of fetch({n}) is not stored whole")


# -- databases ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Database:
    """A database made for one run: a SQLite file in WAL mode, or a PostgreSQL database
    whose sessions default to ``synchronous_commit=on``."""

    backend: str  # "sqlite" or "postgresql"
    url: str  # sqlite:////abs/path or postgresql://user@host:port/name
    path: str = ""  # the SQLite file
    name: str = ""  # the PostgreSQL database

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> Database:
        return cls(**data)

    @property
    def sqlalchemy_url(self) -> str:
        if self.backend == "sqlite":
            return self.url
        return "postgresql+psycopg://" + self.url[len("postgresql://") :]


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(PG_ADMIN_URL, autocommit=True)


def create_database(backend: str, directory: str | None = None) -> Database:
    """A new empty database (SQLite: a file in ``directory``, or in a new temporary one)."""
    if backend == "sqlite":
        folder = directory or tempfile.mkdtemp(prefix="tether-compare-")
        path = str(Path(folder, f"{uuid.uuid4().hex[:12]}.db"))
        lite = sqlite3.connect(path)
        try:
            # WAL is a property of the file: every connection of every system opens it so.
            # synchronous=FULL is set per connection by each system (see its module).
            mode = lite.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise RuntimeError(f"{path}: journal_mode {mode}")
        finally:
            lite.close()
        return Database(backend=backend, url=f"sqlite:///{path}", path=path)
    name = f"tether_compare_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name}")
        # Every session on it, whatever its client sets at connect time, starts so.
        conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = on")
    return Database(backend=backend, url=f"{PG_SERVER}/{name}", name=name)


def clone_database(db: Database) -> Database:
    """A copy of ``db`` (its file, or ``CREATE DATABASE ... TEMPLATE``); nothing may be
    connected to ``db`` meanwhile."""
    if db.backend == "sqlite":
        lite = sqlite3.connect(db.path)
        try:
            lite.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            lite.close()
        path = str(Path(db.path).with_name(f"{uuid.uuid4().hex[:12]}.db"))
        shutil.copyfile(db.path, path)
        return Database(backend=db.backend, url=f"sqlite:///{path}", path=path)
    name = f"tether_compare_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {db.name}")
        conn.execute(f"ALTER DATABASE {name} SET synchronous_commit = on")
    return Database(backend=db.backend, url=f"{PG_SERVER}/{name}", name=name)


def drop_database(db: Database) -> None:
    if db.backend == "sqlite":
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(db.path + suffix).unlink(missing_ok=True)
        return
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db.name} WITH (FORCE)")


@contextmanager
def fresh_database(backend: str) -> Iterator[Database]:
    """A new database, dropped afterwards."""
    folder = tempfile.mkdtemp(prefix="tether-compare-") if backend == "sqlite" else None
    db = create_database(backend, folder)
    try:
        yield db
    finally:
        drop_database(db)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def query(db: Database, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` (with ``:name`` parameters) on a connection of its own."""
    engine = sa.create_engine(db.sqlalchemy_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


def scalar(db: Database, sql: str, **params: Any) -> Any:
    rows = query(db, sql, **params)
    return rows[0][0] if rows else None


_PG_BYTES = """
SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'm') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
"""


def stored_bytes(db: Database) -> int:
    """The bytes the database's tables take now. SQLite: the pages of every b-tree
    (``dbstat``, which reads through the WAL; free pages are not counted). PostgreSQL:
    ``pg_total_relation_size`` (heap, TOAST, indexes, free-space maps) of every table
    outside the system catalogs, whatever schema the system keeps them in."""
    if db.backend == "sqlite":
        conn = sqlite3.connect(db.path)
        try:
            return int(conn.execute("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat").fetchone()[0])
        finally:
            conn.close()
    return int(scalar(db, _PG_BYTES))


def load_average() -> float:
    return os.getloadavg()[0]


RESULT_MARK = "COMPARE-RESULT "


def emit(result: Mapping[str, Any]) -> None:
    """Hand ``result`` to the parent: one marked JSON line on stdout (a peer may print
    its own lines around it)."""
    print(RESULT_MARK + json.dumps(result), flush=True)
