"""The part of the Engine that serves people rather than runs: who may decide what, what
a token names, readiness, counts for metrics, users and their keys, migration. The HTTP
layer and the CLI reach the store only through these."""

from __future__ import annotations

import logging

from tether import inputs
from tether._runtime.services import hop, hop_once
from tether.agent import Agent
from tether.errors import NotReady
from tether.results import Inbox, TokenLookup
from tether.runs import RunState
from tether.store import Store, upgrade
from tether.store.users import new_key
from tether.tokens import hash_token

log = logging.getLogger(__name__)


class ServiceAPI:
    """Mixed into ``Engine``: the calls an inbox, an operator or a metrics scrape makes."""

    store: Store
    _opened: bool

    @property
    def agent(self) -> Agent:
        raise NotImplementedError

    async def open(self) -> None:
        raise NotImplementedError

    async def migrate(self) -> None:
        """Upgrade the schema to this code's version, then make sure the agent's fixed
        users exist. Safe twice: both are no-ops the second time."""
        await hop(upgrade, self.store.engine)
        self._opened = True
        await self.ensure_agent_users()

    async def ensure_agent_users(self) -> None:
        """Make sure the users the agent publishes (``Agent.users``) exist with their keys."""
        for user_id, key in self.agent.users.items():
            await self.add_user(user_id, key)

    async def may_decide(self, owner: str, viewer: str) -> bool:
        """Whether ``viewer`` may decide ``owner``'s pending calls, by the owner's scope
        now. A scope that cannot be resolved allows nobody but the owner."""
        if owner == viewer:
            return True
        try:
            scope = await self.agent.resolve_scope(owner)
        except Exception as exc:
            log.warning(
                "scope unavailable",
                extra={"action": "scope", "user": owner, "error": type(exc).__name__},
            )
            return False
        return scope.may_approve(viewer)

    async def pending_approvals(self, viewer: str, *, limit: int = 100) -> Inbox:
        """Suspended runs inside their window that ``viewer`` owns or may approve, soonest
        expiry first."""
        await self.open()
        runs, now = await hop(self.store.open_suspensions, limit)
        allowed: dict[str, bool] = {}
        mine = []
        for run in runs:
            if run.user_id not in allowed:
                allowed[run.user_id] = await self.may_decide(run.user_id, viewer)
            if allowed[run.user_id]:
                mine.append(run)
        return Inbox(runs=mine, now=now)

    async def approval_request(self, token: str) -> TokenLookup:
        """What an approval token names now; for pages that show a request before any
        decision. Never changes anything."""
        await self.open()
        run, used = await hop(self.store.find_by_token, hash_token(inputs.token(token)))
        decided = await hop(self.store.get_run, used.run_id) if used is not None else None
        now = await hop(self.store.now)
        if run is not None and run.state is not RunState.SUSPENDED:
            run = None
        return TokenLookup(run=run, used=used, decided_run=decided, now=now)

    async def owner_of_token(self, token: str) -> str | None:
        """The user whose run a token belongs to (pending or used), for the operator CLI."""
        found = await self.approval_request(token)
        if found.run is not None:
            return found.run.user_id
        return found.decided_run.user_id if found.decided_run is not None else None

    # -- the service -----------------------------------------------------------------------

    async def ready(self) -> None:
        """Raise ``not_ready`` unless the database answers and its schema is current."""
        try:
            await hop_once(self.store.ping)
        except Exception as exc:
            raise NotReady(f"database unreachable: {type(exc).__name__}") from exc
        await self.open()

    async def now(self) -> float:
        """The database's clock, in epoch seconds (invariant 11)."""
        return await hop(self.store.now)

    async def counts_by_state(self) -> dict[str, int]:
        """How many runs are in each state, fleet-wide (every state present)."""
        await self.open()
        return await hop(self.store.count_by_state)

    async def user_for_key(self, key: str) -> str | None:
        """The user an API key belongs to, or None."""
        if not isinstance(key, str) or not key or len(key) > 512:
            return None
        await self.open()
        return await hop(self.store.user_for_key, key)

    async def add_user(self, user_id: str, key: str | None = None) -> str:
        """Create ``user_id`` if missing and give it a key (``key`` or a new one); returns
        the key, which is stored only hashed. Safe twice: an existing user keeps its keys."""
        inputs.user_id(user_id, "a user name")
        key = key or new_key()
        await self.open()
        await hop(self.store.add_user, user_id, key)
        return key
