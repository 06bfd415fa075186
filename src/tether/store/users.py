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
from tether.store.schema import api_keys, users

MAX_KEY_CHARS = 512

_OWNER_OF_KEY = sa.select(api_keys.c.user_id).where(api_keys.c.key_hash == sa.bindparam("b_hash"))


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh API key with 256 bits of randomness."""
    return "tth_" + secrets.token_urlsafe(32)


def _hash_if_valid(key: object) -> str | None:
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
        key_hash = _hash_if_valid(key)
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
        key_hash = _hash_if_valid(key)
        if key_hash is None:
            return None
        with self.engine.connect() as conn:
            owner = conn.execute(_OWNER_OF_KEY, {"b_hash": key_hash}).scalar()
        return None if owner is None else str(owner)


def add_user(store: Users, user_id: str, key: str | None = None) -> str:
    """Create ``user_id`` if missing and give it a key (``key`` or a new one); returns the
    key, which is not stored and cannot be shown again (for callers holding a Store)."""
    key = key or new_key()
    store.add_user(user_id, key)
    return key
