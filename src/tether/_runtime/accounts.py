"""The ``Engine``'s account methods: inbox sessions (opened by a key, checked on every use,
ended by signing out or when the key goes) and user management (add, list, remove, rotate
a key, the agent's fixed users). Each is one store call through one thread hop."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.opening import opens
from tether.errors import NotFound
from tether.store.users import hash_key, new_key

if TYPE_CHECKING:
    from tether._runtime.services import Services

MAX_SID_CHARS = 128


class AccountMethods:
    """Mixed into ``Engine``: it supplies ``_services`` and ``open()``."""

    _services: Services

    async def open(self) -> None:
        raise NotImplementedError

    @opens
    async def open_session(self, key: str, ttl_s: float) -> tuple[str, str] | None:
        """Sign in with an API key: ``(user, session id)`` for a session of ``ttl_s``
        seconds, or None for a key that is no key. Only the id's hash is stored."""
        if not isinstance(key, str) or not key:
            return None
        sid = secrets.token_urlsafe(24)
        user = await hop(self._services.store.open_session, key, hash_key(sid), ttl_s)
        return None if user is None else (user, sid)

    @opens
    async def session_user(self, sid: str) -> str | None:
        """The user of a live session; None once it was ended, expired, or its key removed."""
        if not isinstance(sid, str) or not sid or len(sid) > MAX_SID_CHARS:
            return None
        return await hop(self._services.store.session_user, hash_key(sid))

    @opens
    async def end_session(self, sid: str) -> None:
        """Sign out: the session no longer works, anywhere. Safe twice."""
        if isinstance(sid, str) and sid and len(sid) <= MAX_SID_CHARS:
            await hop(self._services.store.end_session, hash_key(sid))

    @opens
    async def list_users(self) -> list[dict[str, Any]]:
        """Every user by name, with when it was created and how many keys it has."""
        rows = await hop(self._services.store.list_users)
        return [{"name": name, "created_at": at, "keys": keys} for name, at, keys in rows]

    @opens
    async def remove_user(self, user: str) -> None:
        """Delete ``user`` and its keys and end its sessions; its runs are kept.
        ``not_found`` if there is no such user."""
        inputs.user_id(user, "a user name")
        if not await hop(self._services.store.remove_user, user):
            raise NotFound(f"no user named {user!r}")

    @opens
    async def rotate_key(self, user: str) -> str:
        """Give ``user`` a new key and revoke every old one with the sessions they opened;
        returns the new key (stored only hashed). ``not_found`` if there is no such user."""
        inputs.user_id(user, "a user name")
        key = new_key()
        if not await hop(self._services.store.rotate_key, user, key):
            raise NotFound(f"no user named {user!r}")
        return key

    async def user_for_key(self, key: str) -> str | None:
        """The user an API key belongs to, or None."""
        if not isinstance(key, str) or not key or len(key) > 512:
            return None
        await self.open()
        return await hop(self._services.store.user_for_key, key)

    async def add_user(self, user: str, key: str | None = None) -> str:
        """Create ``user`` if missing and give it a key (``key`` or a new one); returns the
        key, which is stored only hashed. Safe twice: an existing user keeps its keys."""
        inputs.user_id(user, "a user name")
        key = key or new_key()
        await self.open()
        await hop(self._services.store.add_user, user, key)
        return key

    async def ensure_agent_users(self) -> None:
        """Make sure the users the agent publishes (``Agent.users``) exist with their keys."""
        for user, key in self._services.agent.users.items():
            await self.add_user(user, key)
