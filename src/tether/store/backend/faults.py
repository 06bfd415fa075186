"""Which database errors are transient, and whether a failed store call committed anything.

A transient error is one the next attempt may well not meet: a dropped or refused
connection, a server shutting down or restarting, a serialization failure or deadlock, a
pool that had no connection free in time, and on SQLite a locked database, a full disk or
an I/O error. Anything else (a constraint, a programming error) is not transient.

A *refusal* is a connection the server (or the resolver) turned down for a reason the
next attempt meets again: a database or role that does not exist, a failed password, a
host name that does not resolve, a malformed connection option, a connection pooler that
refuses a startup parameter. It is never retried:
the engine raises ``DatabaseMisconfigured`` at once, with the server's words and what to
change.

A store call may be tried again only if nothing of it was committed. The engine's
``commit`` event marks the calling thread just before COMMIT is sent, so a transient
error met after that mark is *ambiguous*: the COMMIT may have landed. ``attempt`` runs one
store call in the calling thread and reports a transient error as ``Transient``, with
that mark; ``tether._runtime.hop`` decides whether to try again: only a call marked ``idempotent``
is tried again after an ambiguous error.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from tether.errors import DatabaseMisconfigured

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

# SQLite's transient OperationalErrors, by message (the module has no finer classes).
_SQLITE_TRANSIENT = ("locked", "busy", "disk", "full", "unable to open", "i/o")

# Connection refusals that trying again cannot cure, by libpq's message (psycopg gives a
# failed connection no SQLSTATE), each with what to change. "Temporary failure in name
# resolution" is not here: a resolver that is down may be back at the next attempt.
_REFUSALS = (
    (
        re.compile(r'database "(?P<name>[^"]+)" does not exist'),
        "create it (`createdb {name}`) or name another in TETHER_DATABASE_URL",
    ),
    (
        re.compile(r'role "(?P<name>[^"]+)" does not exist'),
        "create it (`createuser {name}`) or name another user in TETHER_DATABASE_URL",
    ),
    (
        re.compile(r"password authentication failed|authentication failed|no pg_hba\.conf entry"),
        "check the user and password in TETHER_DATABASE_URL",
    ),
    (
        re.compile(r"Name or service not known|nodename nor servname|could not translate host"),
        "check the host name in TETHER_DATABASE_URL",
    ),
    (
        re.compile(r"invalid connection option|invalid \w+ value|invalid integer value"),
        "check the options in TETHER_DATABASE_URL",
    ),
    (
        # PgBouncer's refusal of the startup parameter a direct connection sends.
        re.compile(r"unsupported startup parameter"),
        "TETHER_DATABASE_URL reaches a connection pooler: add ?pool_mode=transaction to it "
        "(docs/operations.md, Behind PgBouncer)",
    ),
)

_local = threading.local()


class Transient(Exception):
    """A store call met a transient database error; ``ambiguous`` when a COMMIT of it had
    been sent, so it may have taken effect. The driver's error is the ``__cause__``."""

    def __init__(self, error: BaseException, *, ambiguous: bool) -> None:
        super().__init__(f"{type(error).__name__}: {error}"[:500])
        self.ambiguous = ambiguous


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error worth trying again after a pause."""
    if isinstance(exc, sa_exc.TimeoutError):  # no pooled connection free in time
        return True
    cause: BaseException | None = exc
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        cause = exc.orig
    if isinstance(cause, sqlite3.OperationalError):
        message = str(cause).lower()
        return any(word in message for word in _SQLITE_TRANSIENT)
    # A psycopg error exists only once psycopg was loaded (by a PostgreSQL store): looked
    # up, not imported, so classifying an error on SQLite never loads the driver.
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(
        cause, (psycopg.OperationalError, psycopg.InterfaceError)
    ):
        return True  # connection lost or refused, shutdown, serialization, deadlock
    return False


def refusal(exc: BaseException) -> str | None:
    """What the server said and what to change, when ``exc`` is a connection refusal that
    trying again cannot cure (a missing database or role, bad credentials, an unknown
    host); else None."""
    cause = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    psycopg = sys.modules.get("psycopg")  # loaded only by a PostgreSQL store
    if psycopg is None or not isinstance(cause, psycopg.OperationalError):
        return None
    said = " ".join(str(cause).split()).removeprefix("connection failed: ")
    for pattern, hint in _REFUSALS:
        found = pattern.search(said)
        if found is not None:
            return f"{said}: {hint.format(**found.groupdict())}"
    return None


def idempotent(fn: F) -> F:
    """Mark a store call that may be tried again even after its COMMIT was cut off: it
    detects its own earlier landing (a step write compares the message count), so a
    second try can never apply it twice."""
    fn.idempotent = True  # type: ignore[attr-defined]
    return fn


def is_idempotent(fn: Callable[..., object]) -> bool:
    return bool(getattr(fn, "idempotent", False))


def track_commits(engine: Engine) -> None:
    """Mark the calling thread whenever ``engine`` is about to send a COMMIT."""

    @sa.event.listens_for(engine, "commit")
    def _on_commit(_conn: sa.Connection) -> None:
        _local.committing = True


def name_refusals(engine: Engine) -> None:
    """Raise a connection refusal of ``engine`` (see ``refusal``) as ``DatabaseMisconfigured``
    naming the URL (without its password), wherever the connection was asked for."""

    @sa.event.listens_for(engine, "handle_error")
    def _on_error(context: sa.engine.ExceptionContext) -> None:
        said = refusal(context.original_exception)
        if said is not None:
            url = engine.url.render_as_string(hide_password=True)
            raise DatabaseMisconfigured(
                f"cannot connect to the database {url}: {said}"
            ) from context.original_exception


def cut_at_commit(exc: BaseException) -> bool:
    """Whether ``exc``, raised in this thread's store call, is a transient error met after
    a COMMIT was sent: the transaction may have landed."""
    return bool(getattr(_local, "committing", False)) and is_transient(exc)


def not_committed() -> None:
    """This thread's COMMIT that was cut off is known not to have landed (the server said
    so): the call may be tried again like one that failed before its COMMIT."""
    _local.committing = False


def attempt(call: Callable[[], T]) -> T:
    """Run one store call in this thread; a transient error comes out as ``Transient``."""
    _local.committing = False
    try:
        return call()
    except Exception as exc:
        if is_transient(exc):
            raise Transient(exc, ambiguous=bool(_local.committing)) from exc
        raise
    finally:
        _local.committing = False
