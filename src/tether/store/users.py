"""Users and their API keys (reference §6). Keys are random, shown once, and stored only as
SHA-256; a revoked key's hash goes to ``revoked_keys`` and no key with it is stored again.

Adding is race-free on both backends: the user and the key are each inserted with
``ON CONFLICT DO NOTHING``, then the key's owner is read back in the same transaction.

Removing a user is one transaction (``remove_user``): their row is marked removed (it
stays, so nobody takes the name until their data is erased), their schedules, keys and
sessions go, and their runs that are queued, running or suspended are cancelled. Every
run or schedule a user starts, continues or forks passes ``admit`` in the transaction
that writes it, which reads the user's row under a shared lock before any other row: a
removal (which updates that row first) waits for the writers in flight, then cancels
what they wrote too, and every writer after it sees the user removed.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether import inputs
from tether.errors import InvalidInput
from tether.runs import RunState
from tether.store import audit
from tether.store.audit import AuditKind
from tether.store.backend.announce import mark
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect
from tether.store.base import StoreBase
from tether.store.sql.schema import api_keys, revoked_keys, runs, schedules, users, web_sessions
from tether.store.sql.steps import INSERT_EVENT
from tether.store.sql.transitions import Transition

MAX_KEY_CHARS = 512

_USER = users.c.id == sa.bindparam("b_user")
_LIVE = users.c.removed_at.is_(None)
_OWNER_OF_KEY = sa.select(api_keys.c.user_id).where(api_keys.c.key_hash == sa.bindparam("b_hash"))
_REVOKED = sa.select(revoked_keys.c.key_hash).where(
    revoked_keys.c.key_hash == sa.bindparam("b_hash")
)
_ACCOUNT = sa.select(users.c.removed_at, users.c.max_priority).where(_USER)
_SHOWN = (users.c.id, users.c.created_at, users.c.removed_at, users.c.max_priority)
_LIST_USERS = (
    sa.select(*_SHOWN, users.c.retention_days, sa.func.count(api_keys.c.key_hash))
    .select_from(users.outerjoin(api_keys, api_keys.c.user_id == users.c.id))
    .group_by(*_SHOWN, users.c.retention_days)
    .order_by(users.c.id)
)
_MARK_REMOVED = users.update().where(_USER, _LIVE).values(removed_at=db_now()).returning(users.c.id)
# Sessions are deleted explicitly before their keys: the foreign key's cascade would do it
# too, but a revocation must not depend on SQLite's foreign_keys pragma being on.
_END_USER_SESSIONS = web_sessions.delete().where(web_sessions.c.user_id == sa.bindparam("b_user"))
_KEYS_OF_USER = sa.select(api_keys.c.key_hash, db_now()).where(
    api_keys.c.user_id == sa.bindparam("b_user")
)
_DELETE_USER_KEYS = api_keys.delete().where(api_keys.c.user_id == sa.bindparam("b_user"))
_DELETE_USER_SCHEDULES = schedules.delete().where(schedules.c.user_id == sa.bindparam("b_user"))
# What a removal stops: every run of the user a worker may carry or a person may resume.
_CANCEL_ACTIVE = Transition(
    [RunState.QUEUED, RunState.RUNNING, RunState.SUSPENDED, RunState.WAITING],
    RunState.CANCELLED,
    runs.c.user_id == sa.bindparam("b_user"),
    owner=None,
    ready_at=None,
    updated_at=db_now(),
    returning=(runs.c.id, runs.c.root_run_id),
)


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh API key with 256 bits of randomness."""
    return "tth_" + secrets.token_urlsafe(32)


def hash_if_valid(key: object) -> str | None:
    """The key's hash, or None if it cannot be a key (empty, too long, not text)."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        return None
    try:
        return hash_key(key)
    except UnicodeEncodeError:
        return None


@dataclass(frozen=True, kw_only=True)
class UserSettings:
    """What an operator sets on a user (``tether users add|set``); None leaves it as is."""

    # The highest priority the user may ask (-10 to 10; reference §13).
    max_priority: int | None = None
    # Days their halted and terminal runs are kept (> 0, decimals; reference §20), in
    # place of TETHER_RETENTION_DAYS.
    retention_days: float | None = None

    def changes(self) -> dict[str, Any]:
        """The columns to set: the settings given."""
        return {name: value for name, value in asdict(self).items() if value is not None}


@dataclass(frozen=True, kw_only=True)
class Removal:
    """What removing a user did, all in one transaction."""

    user: str
    keys_revoked: int
    schedules_deleted: int
    runs_cancelled: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def admit(
    conn: Connection,
    dialect: Dialect,
    user_id: str,
    *,
    priority: int | None = None,
    bound: int | None = None,
) -> int:
    """The priority a run of ``user_id`` is written with, in the caller's transaction,
    the user's row read under a shared lock (see the module's docstring), before any other
    row the caller locks. ``InvalidInput`` if the user was removed. With ``bound``
    (TETHER_MAX_PRIORITY, unless the user has a bound of their own), a ``priority`` above
    it is ``InvalidInput`` naming the bound, and no priority is 0, or the bound when it is
    lower; without one, ``priority`` or 0."""
    row = conn.execute(dialect.share(_ACCOUNT), {"b_user": user_id}).first()
    if row is not None and row.removed_at is not None:
        raise InvalidInput(f"user {user_id!r} was removed: no run of theirs may start or go on")
    if bound is None:
        return priority or 0
    if row is not None and row.max_priority is not None:
        bound = int(row.max_priority)
    if priority is None:
        return min(0, bound)
    if priority > bound:
        raise InvalidInput(
            f"priority {priority} is above {user_id}'s bound of {bound} (TETHER_MAX_PRIORITY, "
            f"or tether users set {user_id} --max-priority N)",
            max_priority=bound,
        )
    return priority


def is_removed(conn: Connection, dialect: Dialect, user_id: str) -> bool:
    """Whether ``user_id`` was removed, their row read under a shared lock (``admit``)."""
    row = conn.execute(dialect.share(_ACCOUNT), {"b_user": user_id}).first()
    return row is not None and row.removed_at is not None


def _refuse_removed(conn: Connection, user_id: str) -> None:
    """``InvalidInput`` naming ``tether users erase`` if ``user_id`` was removed."""
    removed = conn.execute(_ACCOUNT, {"b_user": user_id}).first()
    if removed is not None and removed.removed_at is not None:
        raise InvalidInput(
            f"user {user_id!r} was removed; the name cannot be used again until their data "
            f"is erased (tether users erase {user_id})"
        )


class Users(StoreBase):
    """Users and API keys."""

    def add_user(self, user_id: str, key: str, settings: UserSettings | None = None) -> None:
        """Create ``user_id`` if missing, give it ``key`` and ``settings``. Safe twice and
        under races: an existing user keeps its other keys, an existing key of this user is
        kept. Refused (``InvalidInput``, nothing written): a key of another user or one
        revoked, and the name of a removed user."""
        inputs.user_id(user_id, "a user name")
        key_hash = _valid_hash(key)
        new_user = self.dialect.insert_new(users).values(id=user_id, created_at=db_now())
        new_key_row = self.dialect.insert_new(api_keys).values(
            key_hash=key_hash, user_id=user_id, created_at=db_now()
        )
        with self.engine.begin() as conn:
            conn.execute(new_user)
            _refuse_removed(conn, user_id)
            if conn.execute(_REVOKED, {"b_hash": key_hash}).first() is not None:
                raise InvalidInput("that key was revoked; give a new one")
            conn.execute(new_key_row)
            owner = conn.execute(_OWNER_OF_KEY, {"b_hash": key_hash}).scalar_one()
            if owner != user_id:
                raise InvalidInput("that key belongs to another user")
            if settings is not None and settings.changes():
                conn.execute(users.update().where(_USER).values(**settings.changes()), _of(user_id))

    def add_published_user(self, user_id: str, key: str, settings: UserSettings) -> bool:
        """An agent's published user (the demo's): created with ``key`` only if there never
        was such a user, and never with a key once revoked; ``settings`` fill what is unset
        of a user not removed. So a rotated or removed published key stays revoked across
        restarts. Whether the user is there and not removed. Safe twice and under races."""
        key_hash = _valid_hash(key)
        created = self.dialect.insert_new(users).values(id=user_id, created_at=db_now())
        with self.engine.begin() as conn:
            if conn.execute(created.returning(users.c.id)).first() is not None:
                if conn.execute(_REVOKED, {"b_hash": key_hash}).first() is None:
                    conn.execute(
                        self.dialect.insert_new(api_keys).values(
                            key_hash=key_hash, user_id=user_id, created_at=db_now()
                        )
                    )
            for name, value in settings.changes().items():
                unset = users.c[name].is_(None)
                conn.execute(
                    users.update().where(_USER, _LIVE, unset).values({name: value}), _of(user_id)
                )
            return (
                conn.execute(sa.select(users.c.id).where(_USER, _LIVE), _of(user_id)).first()
                is not None
            )

    def set_user(self, user_id: str, settings: UserSettings) -> bool:
        """Change ``settings`` of ``user_id``; False (nothing written) if there is no such
        user, or they were removed."""
        with self.engine.begin() as conn:
            changed = conn.execute(
                users.update().where(_USER, _LIVE).values(**settings.changes()), _of(user_id)
            )
            return changed.rowcount > 0

    def user_for_key(self, key: str) -> str | None:
        """The user an API key belongs to, or None (for anything that is not a key)."""
        key_hash = hash_if_valid(key)
        if key_hash is None:
            return None
        with self.engine.connect() as conn:
            owner = conn.execute(_OWNER_OF_KEY, {"b_hash": key_hash}).scalar()
        return None if owner is None else str(owner)

    def list_users(self) -> list[dict[str, Any]]:
        """Every user by name, removed ones included: name, created_at, how many keys,
        removed_at (None: not removed), max_priority and retention_days (None: the
        setting's)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_LIST_USERS).all()
        return [
            {
                "name": str(name),
                "created_at": float(created),
                "keys": int(keys),
                "removed_at": removed,
                "max_priority": bound,
                "retention_days": days,
            }
            for name, created, removed, bound, days, keys in rows
        ]

    def remove_user(self, user_id: str) -> Removal | None:
        """Remove ``user_id`` in one transaction: delete their schedules, revoke their keys
        and end their sessions, cancel their queued, running and suspended runs (each with
        a ``cancelled`` event, ``reason: user_removed``; a worker carrying one is fenced at
        its next write), and mark the row removed. Their halted and finished runs stay.
        None (nothing written) if there is no such user or they were removed already."""
        with self.begin() as conn:
            # The user's row first, as every writer of a run or a schedule of theirs takes
            # it (``admit``): this waits for those in flight, and what they wrote is seen
            # by the statements after it.
            if conn.execute(_MARK_REMOVED, _of(user_id)).first() is None:
                return None
            return withdraw(conn, self.dialect, user_id)

    def rotate_key(self, user_id: str, key: str) -> bool:
        """Replace every key of ``user_id`` with ``key`` (the old ones revoked for good) and
        end the sessions the old keys opened, in one transaction; False (nothing written)
        if there is no such user or they were removed."""
        key_hash = _valid_hash(key)
        params = _of(user_id)
        with self.engine.begin() as conn:
            if conn.execute(sa.select(users.c.id).where(_USER, _LIVE), params).first() is None:
                return False
            _revoke_keys(conn, self.dialect, params)
            conn.execute(_DELETE_USER_KEYS, params)
            conn.execute(
                api_keys.insert().values(key_hash=key_hash, user_id=user_id, created_at=db_now())
            )
        return True


def withdraw(conn: Connection, dialect: Dialect, user_id: str) -> Removal:
    """In the caller's transaction, once the user's row is marked removed (the lock every
    writer of theirs takes, ``admit``): delete their schedules, revoke their keys and end
    their sessions, cancel their queued, running, suspended and waiting runs (each with
    its event and audit record). Safe twice: the second finds nothing left to do."""
    params = _of(user_id)
    deleted = conn.execute(_DELETE_USER_SCHEDULES, params).rowcount
    _revoke_keys(conn, dialect, params)
    revoked = conn.execute(_DELETE_USER_KEYS, params).rowcount
    rows = _CANCEL_ACTIVE.many(conn, params)
    cancelled = [str(row.id) for row in rows]
    _record_cancelled(conn, cancelled)
    records = [
        {"run_id": r.id, "root_run_id": r.root_run_id or r.id, "user_id": user_id} for r in rows
    ]
    why = {"reason": "its user was removed", "outcome": "cancelled"}
    audit.append(conn, AuditKind.CANCELLED, [{**r, **why} for r in records])
    return Removal(
        user=user_id, keys_revoked=revoked, schedules_deleted=deleted, runs_cancelled=cancelled
    )


def _of(user_id: str) -> dict[str, Any]:
    return {"b_user": user_id}


def _valid_hash(key: str) -> str:
    key_hash = hash_if_valid(key)
    if key_hash is None:
        raise InvalidInput(f"an API key must be 1-{MAX_KEY_CHARS} characters of text")
    return key_hash


def _revoke_keys(conn: Connection, dialect: Dialect, params: dict[str, Any]) -> None:
    """Record the hashes of the user's keys as revoked and end the sessions they opened
    (the keys themselves are deleted next)."""
    revoked = dialect.insert_new(revoked_keys).from_select(
        ["key_hash", "revoked_at"], _KEYS_OF_USER
    )
    conn.execute(revoked, params)
    conn.execute(_END_USER_SESSIONS, params)


def _record_cancelled(conn: Connection, run_ids: list[str]) -> None:
    """The ``cancelled`` event of each run a removal cancelled, saying why."""
    if not run_ids:
        return
    data = {"reason": "user_removed", "message": "its user was removed"}
    conn.execute(INSERT_EVENT, [{"run_id": i, "kind": "cancelled", "data": data} for i in run_ids])
    mark(conn, *run_ids)


def add_user(store: Users, user_id: str, key: str | None = None) -> str:
    """Create ``user_id`` if missing and give it a key (``key`` or a new one); returns the
    key, which is not stored and cannot be shown again (for callers holding a Store)."""
    key = key or new_key()
    store.add_user(user_id, key)
    return key
