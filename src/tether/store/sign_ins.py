"""The inbox's sign-ins, server-side (migration 0008, table ``web_sessions``): a browser's
session is a row tied to the API key that opened it, so signing out, removing a user or
rotating a key ends it at once. Only the SHA-256 of the cookie's session id is stored;
expiry is judged by the database's clock.
"""

from __future__ import annotations

import sqlalchemy as sa

from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import api_keys, web_sessions
from tether.store.users import hash_if_valid

_OWNER = sa.select(api_keys.c.user_id).where(api_keys.c.key_hash == sa.bindparam("b_key"))
_OPEN = web_sessions.insert().values(
    sid_hash=sa.bindparam("b_sid"),
    key_hash=sa.bindparam("b_key"),
    user_id=sa.bindparam("b_user"),
    created_at=db_now(),
    expires_at=db_now() + sa.bindparam("b_ttl", type_=sa.Float()),
)
_PURGE = web_sessions.delete().where(web_sessions.c.expires_at <= db_now())
_USER = sa.select(web_sessions.c.user_id).where(
    web_sessions.c.sid_hash == sa.bindparam("b_sid"), web_sessions.c.expires_at > db_now()
)
_END = web_sessions.delete().where(web_sessions.c.sid_hash == sa.bindparam("b_sid"))


class SignIns(StoreBase):
    """Opening, checking and ending the inbox's sign-in sessions."""

    def open_sign_in(self, key: str, sid_hash: str, ttl_s: float) -> str | None:
        """Open a session of ``key``'s user for ``ttl_s`` seconds; returns the user, or None
        (nothing written) when ``key`` is no key. Expired sessions are purged on the way."""
        key_hash = hash_if_valid(key)
        if key_hash is None:
            return None
        with self.engine.begin() as conn:
            conn.execute(_PURGE)
            user = conn.execute(_OWNER, {"b_key": key_hash}).scalar()
            if user is None:
                return None
            params = {"b_sid": sid_hash, "b_key": key_hash, "b_user": user, "b_ttl": ttl_s}
            conn.execute(_OPEN, params)
        return str(user)

    def sign_in_user(self, sid_hash: str) -> str | None:
        """The user of a live session, or None (ended, expired, or its key removed)."""
        with self.engine.connect() as conn:
            user = conn.execute(_USER, {"b_sid": sid_hash}).scalar()
        return None if user is None else str(user)

    def end_sign_in(self, sid_hash: str) -> None:
        """End one session (signing out). Safe twice: an ended session stays ended."""
        with self.engine.begin() as conn:
            conn.execute(_END, {"b_sid": sid_hash})
