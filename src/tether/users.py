"""Users and their API keys. Keys are random, shown once, and stored only as SHA-256."""

from __future__ import annotations

import hashlib
import secrets

import sqlalchemy as sa

from tether import inputs
from tether.errors import InvalidInput
from tether.store import Store
from tether.store.engine import db_now
from tether.store.schema import api_keys, users

# The demo users of SPEC §8, with the fixed keys the README lists.
DEMO_KEYS = {"dana": "tether-demo-dana", "miguel": "tether-demo-miguel"}


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh API key with 256 bits of randomness."""
    return "tth_" + secrets.token_urlsafe(32)


def add_user(store: Store, user_id: str, key: str | None = None) -> str:
    """Create ``user_id`` if missing and give it a key (``key`` or a new one); returns the
    key, which is not stored and cannot be shown again. Safe twice: an existing user keeps
    its other keys."""
    inputs.user_id(user_id, "a user name")
    key = key or new_key()
    with store.engine.begin() as conn:
        exists = conn.execute(sa.select(users.c.id).where(users.c.id == user_id)).first()
        if exists is None:
            conn.execute(users.insert().values(id=user_id, created_at=db_now()))
        known = conn.execute(
            sa.select(api_keys.c.user_id).where(api_keys.c.key_hash == hash_key(key))
        ).first()
        if known is None:
            conn.execute(
                api_keys.insert().values(
                    key_hash=hash_key(key), user_id=user_id, created_at=db_now()
                )
            )
        elif known[0] != user_id:
            raise InvalidInput("that key belongs to another user")
    return key


def user_for_key(store: Store, key: str) -> str | None:
    """The user an API key belongs to, or None."""
    if not key or len(key) > 512:
        return None
    with store.engine.begin() as conn:
        row = conn.execute(
            sa.select(api_keys.c.user_id).where(api_keys.c.key_hash == hash_key(key))
        ).first()
    return str(row[0]) if row else None


def ensure_demo_users(store: Store) -> None:
    """Make sure the demo users exist with their fixed keys."""
    for user_id, key in DEMO_KEYS.items():
        add_user(store, user_id, key)
