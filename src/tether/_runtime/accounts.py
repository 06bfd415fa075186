"""The ``Engine``'s account methods: inbox sessions (opened by a key, checked on every use,
ended by signing out or when the key goes) and user management (add, set, list, remove,
rotate a key, the agent's fixed users; reference §6). Each is one store call through one
thread hop."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.opening import opens
from tether.errors import InvalidInput, NotFound
from tether.store.users import Removal, UserSettings, hash_key, new_key

if TYPE_CHECKING:
    from tether._runtime.services import Services

log = logging.getLogger(__name__)

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
        """Every user by name, removed ones included (their name stays taken until their
        data is erased): when created, how many keys, ``removed_at`` (null unless removed)
        and ``max_priority`` (null: TETHER_MAX_PRIORITY)."""
        return await hop(self._services.store.list_users)

    @opens
    async def remove_user(self, user: str) -> Removal:
        """Remove ``user`` in one transaction: their keys revoked and sessions ended, their
        schedules deleted, their queued, running and suspended runs cancelled (a worker
        carrying one stops at its next write); their halted and finished runs stay for
        their retention, and the name stays taken until their data is erased.
        ``not_found`` if there is no such user, or they were removed already."""
        inputs.user_id(user, "a user name")
        removed = await hop(self._services.store.remove_user, user)
        if removed is None:
            raise NotFound(f"no user named {user!r} (or removed already)")
        counts = {
            "keys_revoked": removed.keys_revoked,
            "runs_cancelled": len(removed.runs_cancelled),
        }
        log.info("user removed", extra={"action": "remove_user", "user": user, **counts})
        return removed

    @opens
    async def set_user(self, user: str, *, max_priority: int | None = None) -> None:
        """Change settings of ``user``: ``max_priority``, the highest priority they may ask
        (-10 to 10; reference §13). ``invalid_input`` without a setting or for a bad one,
        ``not_found`` if there is no such user (or they were removed)."""
        inputs.user_id(user, "a user name")
        settings = _settings(max_priority)
        if not settings.changes():
            raise InvalidInput("name a setting to change: max_priority (--max-priority N)")
        if not await hop(self._services.store.set_user, user, settings):
            raise NotFound(f"no user named {user!r}")

    @opens
    async def rotate_key(self, user: str) -> str:
        """Give ``user`` a new key and revoke every old one for good, with the sessions
        they opened; returns the new key (stored only hashed). ``not_found`` if there is
        no such user (or they were removed)."""
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

    async def add_user(
        self, user: str, key: str | None = None, *, max_priority: int | None = None
    ) -> str:
        """Create ``user`` if missing and give it a key (``key`` or a new one) and
        ``max_priority`` if given; returns the key, which is stored only hashed. Safe twice:
        an existing user keeps its keys. ``invalid_input`` for a removed user's name (until
        their data is erased), a revoked key or one of another user."""
        inputs.user_id(user, "a user name")
        settings = _settings(max_priority)
        key = key or new_key()
        await self.open()
        await hop(self._services.store.add_user, user, key, settings)
        return key

    async def ensure_agent_users(self) -> None:
        """Make sure the users the agent publishes (``Agent.users``) exist: each is created
        with its published key only if there never was such a user, and never with a key
        once revoked, so an operator's rotation or removal holds across restarts; their
        bound (``Agent.users_max_priority``) fills one the operator did not set."""
        agent = self._services.agent
        settings = UserSettings(max_priority=agent.users_max_priority)
        await self.open()
        for user, key in agent.users.items():
            inputs.user_id(user, "a published user's name")
            there = await hop(self._services.store.add_published_user, user, key, settings)
            if not there:
                log.info(
                    "published user removed: not added", extra={"action": "users", "user": user}
                )


def _settings(max_priority: int | None) -> UserSettings:
    """The settings given, validated (``invalid_input`` for a bad one)."""
    bound = None if max_priority is None else inputs.max_priority(max_priority)
    return UserSettings(max_priority=bound)
