"""Users and their API keys. Keys are random, shown once, and stored only as SHA-256.

Adding is race-free on both backends: the user and the key are each inserted with
``ON CONFLICT DO NOTHING``, then the key's owner is read back in the same transaction.
"""

from __future__ import annotations

import hashlib
import secrets

import sqlalchemy as sa

from tether import inputs
from tether.errors import InvalidInput
from tether.store.base import StoreBase
from tether.store.clock import db_now
from tether.store.schema import api_keys, users, web_sessions

MAX_KEY_CHARS = 512

_OWNER_OF_KEY = sa.select(api_keys.c.user_id).where(api_keys.c.key_hash == sa.bindparam("b_hash"))
_USER_EXISTS = sa.select(users.c.id).where(users.c.id == sa.bindparam("b_user"))
_LIST_USERS = (
    sa.select(users.c.id, users.c.created_at, sa.func.count(api_keys.c.key_hash))
    .select_from(users.outerjoin(api_keys, api_keys.c.user_id == users.c.id))
    .group_by(users.c.id, users.c.created_at)
    .order_by(users.c.id)
)
# Sessions are deleted explicitly before their keys: the foreign key's cascade would do it
# too, but a revocation must not depend on SQLite's foreign_keys pragma being on.
_END_USER_SESSIONS = web_sessions.delete().where(web_sessions.c.user_id == sa.bindparam("b_user"))
_DELETE_USER_KEYS = api_keys.delete().where(api_keys.c.user_id == sa.bindparam("b_user"))
_DELETE_USER = users.delete().where(users.c.id == sa.bindparam("b_user"))


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


class Users(StoreBase):
    """Users and API keys."""

    def add_user(self, user_id: str, key: str) -> None:
        """Create ``user_id`` if missing and give it ``key``. Safe twice and under races:
        an existing user keeps its other keys, an existing key of this user is kept; a key
        of another user is refused (``InvalidInput``) and nothing is written."""
        inputs.user_id(user_id, "a user name")
        key_hash = hash_if_valid(key)
        if key_hash is None:
            raise InvalidInput(f"an API key must be 1-{MAX_KEY_CHARS} characters of text")
        new_user = self.dialect.insert_new(users).values(id=user_id, created_at=db_now())
        new_key_row = self.dialect.insert_new(api_keys).values(
            key_hash=key_hash, user_id=user_id, created_at=db_now()
        )
        with self.engine.begin() as conn:
            conn.execute(new_user)
            conn.execute(new_key_row)
            owner = conn.execute(_OWNER_OF_KEY, {"b_hash": key_hash}).scalar_one()
            if owner != user_id:
                raise InvalidInput("that key belongs to another user")

    def user_for_key(self, key: str) -> str | None:
        """The user an API key belongs to, or None (for anything that is not a key)."""
        key_hash = hash_if_valid(key)
        if key_hash is None:
            return None
        with self.engine.connect() as conn:
            owner = conn.execute(_OWNER_OF_KEY, {"b_hash": key_hash}).scalar()
        return None if owner is None else str(owner)

    def list_users(self) -> list[tuple[str, float, int]]:
        """Every user, by name: (name, created_at, how many keys)."""
        with self.engine.connect() as conn:
            rows = conn.execute(_LIST_USERS).all()
        return [(str(name), float(created), int(keys)) for name, created, keys in rows]

    def remove_user(self, user_id: str) -> bool:
        """Delete ``user_id``, its keys and every session they opened, in one transaction;
        False if there was no such user. Its runs stay (they are the record)."""
        params = {"b_user": user_id}
        with self.engine.begin() as conn:
            conn.execute(_END_USER_SESSIONS, params)
            conn.execute(_DELETE_USER_KEYS, params)
            return conn.execute(_DELETE_USER, params).rowcount > 0

    def rotate_key(self, user_id: str, key: str) -> bool:
        """Replace every key of ``user_id`` with ``key`` and end the sessions the old keys
        opened, in one transaction; False (nothing written) if there is no such user."""
        key_hash = hash_if_valid(key)
        if key_hash is None:
            raise InvalidInput(f"an API key must be 1-{MAX_KEY_CHARS} characters of text")
        params = {"b_user": user_id}
        with self.engine.begin() as conn:
            if conn.execute(_USER_EXISTS, params).scalar() is None:
                return False
            conn.execute(_END_USER_SESSIONS, params)
            conn.execute(_DELETE_USER_KEYS, params)
            conn.execute(
                api_keys.insert().values(key_hash=key_hash, user_id=user_id, created_at=db_now())
            )
        return True


def add_user(store: Users, user_id: str, key: str | None = None) -> str:
    """Create ``user_id`` if missing and give it a key (``key`` or a new one); returns the
    key, which is not stored and cannot be shown again (for callers holding a Store)."""
    key = key or new_key()
    store.add_user(user_id, key)
    return key
