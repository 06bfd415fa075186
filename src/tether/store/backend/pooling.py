"""Behind a transaction-pooling proxy (PgBouncer ``pool_mode = transaction``): what the
store does differently when its PostgreSQL URL says ``?pool_mode=transaction``.

A transaction pooler lends each transaction whichever server connection is free, so
nothing may outlive a transaction on the server (docs/operations.md, "Behind
PgBouncer"). The parameter is tether's, read from the URL (every process and command
gets it with the address it belongs to, so the two cannot disagree) and removed before
the driver sees it. With it:

- **no server-side prepared statements** (``prepare_threshold=None``): psycopg prepares
  a statement on its sixth execution, and the prepared statement lives on one server
  connection; the next transaction, on another, fails (or two clients collide on its
  name). Each statement is then parsed and planned each time it is sent, in the same
  round trip.
- **no startup parameters**: PgBouncer refuses ``options``, so ``synchronous_commit=on``
  cannot be asked for per connection. It must come from the server's defaults for the
  role or the database (``ALTER ROLE … SET synchronous_commit = on``), which every server
  connection the pooler opens starts with; ``check_commits`` refuses to run when commits
  through the pooler would not be synchronous, so durability is never weaker than direct.
- **LISTEN on a direct connection**: a session's ``LISTEN`` stays on the server
  connection it ran on, whose notices go to whichever client holds it then. The store's
  listen URL (``TETHER_LISTEN_DATABASE_URL``) must reach PostgreSQL without the pooler.
  ``NOTIFY`` is a statement of a transaction and goes through the pooler.
"""

from __future__ import annotations

import enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from tether.errors import ConfigError, DatabaseMisconfigured

PARAMETER = "pool_mode"
# What a direct connection asks for at its start (startup parameters, no round trip).
DIRECT_OPTIONS = "-c synchronous_commit=on"
# The commit levels at least as durable as ``on``: a commit waits for the local flush (and
# for a synchronous standby's, when one is configured).
DURABLE = frozenset({"on", "remote_apply"})


class PoolMode(str, enum.Enum):
    """What sits between the store and PostgreSQL, as the URL says."""

    SESSION = "session"  # nothing, or a pooler that gives each client a session of its own
    TRANSACTION = "transaction"  # a pooler that lends a server connection per transaction


def pool_mode(url: URL) -> PoolMode:
    """The URL's ``pool_mode`` (default ``session``); any other value is refused."""
    raw = url.query.get(PARAMETER)
    if raw is None:
        return PoolMode.SESSION
    if url.get_backend_name() != "postgresql":
        raise ConfigError(f"{PARAMETER} applies to a postgresql:// database URL only")
    if raw == "statement":
        raise ConfigError(
            "pool_mode=statement cannot carry tether: its transactions hold several "
            "statements; run the pooler with pool_mode = transaction"
        )
    try:
        return PoolMode(raw)
    except ValueError:
        raise ConfigError(
            f"{PARAMETER} must be 'transaction' or 'session', got {str(raw)[:40]!r}"
        ) from None


def without_pool_mode(url: URL) -> URL:
    """``url`` as the driver may see it (libpq refuses parameters it does not know)."""
    return url.difference_update_query([PARAMETER])


def connect_args(mode: PoolMode) -> dict[str, Any]:
    """The driver's connection arguments for ``mode`` (see the module)."""
    if mode is PoolMode.TRANSACTION:
        return {"prepare_threshold": None}
    return {"options": DIRECT_OPTIONS}


def listen_url(url: URL, listen: URL | None) -> URL:
    """Where the store's ``LISTEN`` connections go: ``listen``, else the store's own URL,
    which must then not be a transaction pooler's."""
    mode = pool_mode(url)
    if listen is None:
        if mode is PoolMode.TRANSACTION:
            raise ConfigError(
                "TETHER_DATABASE_URL names a transaction pooler (pool_mode=transaction): "
                "set TETHER_LISTEN_DATABASE_URL to a direct connection to PostgreSQL, "
                "since LISTEN needs a session of its own"
            )
        return without_pool_mode(url)
    if listen.get_backend_name() != "postgresql" or url.get_backend_name() != "postgresql":
        raise ConfigError(
            "TETHER_LISTEN_DATABASE_URL is for a postgresql:// TETHER_DATABASE_URL, "
            "and is a postgresql:// URL itself"
        )
    if pool_mode(listen) is PoolMode.TRANSACTION:
        raise ConfigError(
            "TETHER_LISTEN_DATABASE_URL must reach PostgreSQL directly (or through a "
            "session pooler): LISTEN needs a session of its own"
        )
    return without_pool_mode(listen)


_SYNCHRONOUS = sa.text("SELECT current_setting('synchronous_commit')")


def check_commits(engine: Engine) -> None:
    """Refuse to run when a commit through ``engine`` would not be synchronous.

    Behind a transaction pooler the setting cannot be asked for per connection (see the
    module), so it is the server's default for the role and the database, the same on
    every server connection the pooler opens for them: one look, once per process, checks
    it without costing any transaction a round trip."""
    with engine.connect() as conn:
        level = str(conn.execute(_SYNCHRONOUS).scalar_one())
    if level not in DURABLE:
        url = engine.url.render_as_string(hide_password=True)
        raise DatabaseMisconfigured(
            f"commits through {url} would not be durable (synchronous_commit is {level!r} "
            "and a transaction pooler cannot pass tether's own setting): run ALTER ROLE "
            "<tether's user> SET synchronous_commit = on (or ALTER DATABASE) on PostgreSQL"
        )
