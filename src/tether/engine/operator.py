"""The operator's side of an ``Engine`` (``Engine.operator``): the schema, the reaper,
users and their keys (reference §6), every open request, runs stranded on an agent
version (reference §12) and the counts ``/metrics`` shows. The CLI's operator commands
call these; an application rarely does."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tether import failpoints, inputs
from tether._runtime.fleet import versions
from tether._runtime.hop import hop, hop_once
from tether.approvals import inbox
from tether.engine.opening import Side, opens
from tether.errors import ConfigError, InvalidInput, NotFound, NotReady
from tether.results import Inbox, ReapReport
from tether.runs import Run
from tether.store import upgrade
from tether.store.audit import AuditPage, audit_cursor
from tether.store.backend.dialect import Dialect
from tether.store.erasure import Erased
from tether.store.sealing import Rotation, rotate
from tether.store.users import Removal, UserSettings, new_key

log = logging.getLogger(__name__)
T = TypeVar("T")


class Operator(Side):
    """What an operator calls on an engine (``Engine.operator``)."""

    # -- the schema and the reaper ---------------------------------------------------------

    async def migrate(self) -> None:
        """Upgrade the schema to this code's version, then make sure the agent's fixed
        users exist. Safe twice: both are no-ops the second time."""
        store = self._services.store
        await hop(store.check_commits)
        await hop(upgrade, store.engine)
        self._engine._opened = True
        await self.ensure_agent_users()

    async def ready(self) -> None:
        """Raise ``not_ready`` unless the database answers and its schema is current."""
        try:
            await hop_once(self._services.store.ping)
        except Exception as exc:
            raise NotReady(f"database unreachable: {type(exc).__name__}") from exc
        await self.open()

    async def reap(self) -> ReapReport:
        """One reaper pass: recover orphans, expire suspensions, re-send undelivered
        notices, purge past retention (what a worker's reaper does on its interval)."""
        return await self._engine.runner.reap()

    # -- users -------------------------------------------------------------------------------

    @opens
    async def list_users(self) -> list[dict[str, Any]]:
        """Every user by name, removed ones included (their name stays taken until their
        data is erased): when created, how many keys, ``removed_at`` (null unless removed),
        ``max_priority`` (null: TETHER_MAX_PRIORITY) and ``retention_days`` (null:
        TETHER_RETENTION_DAYS)."""
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
    async def set_user(
        self, user: str, *, max_priority: int | None = None, retention_days: float | None = None
    ) -> None:
        """Change settings of ``user``: ``max_priority``, the highest priority they may ask
        (-10 to 10; reference §13), ``retention_days``, how long their halted and finished
        runs are kept (reference §20). ``invalid_input`` without a setting or for a bad
        one, ``not_found`` if there is no such user (or they were removed)."""
        inputs.user_id(user, "a user name")
        settings = _settings(max_priority, retention_days)
        if not settings.changes():
            raise InvalidInput(
                "name a setting to change: max_priority (--max-priority N) or retention_days "
                "(--retention-days N)"
            )
        if not await hop(self._services.store.set_user, user, settings):
            raise NotFound(f"no user named {user!r}")

    @opens
    async def erase_user(self, user: str, *, by: str | None = None) -> Erased:
        """Erase ``user``'s data (reference §20): withdraw them as ``remove_user`` does
        (their runs in flight cancelled, so no worker writes a step after), then delete
        every run of theirs, one transaction per batch of ``purge_batch`` runs, then their
        threads, then their account, their name made a digest where others' data keeps
        it. ``by``: who asks (the user themselves: recorded as their digest; None: an
        operator). Zeros for a name with nothing stored. Safe to run again after a crash
        midway: each transaction finds what is left (never half a run) and finishes it."""
        inputs.user_id(user, "a user name")
        if by is not None:
            inputs.user_id(by, "by")
        store, batch = self._services.store, self._services.settings.purge_batch
        removal = await hop(store.begin_erasure, user)
        runs = 0
        while count := await _batch(store.erase_runs, user, batch, store.dialect, int):
            runs += count
        threads = 0
        while (gone := await _batch(store.erase_threads, user, batch, store.dialect, _rows))[0]:
            threads += gone[1]
        await hop(store.finish_erasure, user, by=by)
        erased = Erased(runs=runs, threads=threads, schedules=removal.schedules_deleted)
        log.info("user erased", extra={"action": "erase_user", "user": user, **erased.to_json()})
        return erased

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

    @opens
    async def add_user(
        self,
        user: str,
        key: str | None = None,
        *,
        max_priority: int | None = None,
        retention_days: float | None = None,
    ) -> str:
        """Create ``user`` if missing and give it a key (``key`` or a new one) and the
        settings given (as ``set_user``); returns the key, which is stored only hashed.
        Safe twice: an existing user keeps its keys. ``invalid_input`` for a removed user's
        name (until their data is erased), a revoked key or one of another user."""
        inputs.user_id(user, "a user name")
        settings = _settings(max_priority, retention_days)
        key = key or new_key()
        await hop(self._services.store.add_user, user, key, settings)
        return key

    @opens
    async def ensure_agent_users(self) -> None:
        """Make sure the users the agent publishes (``Agent.users``) exist: each is created
        with its published key only if there never was such a user, and never with a key
        once revoked, so an operator's rotation or removal holds across restarts; their
        bound (``Agent.users_max_priority``) fills one the operator did not set."""
        agent = self._services.agent
        settings = UserSettings(max_priority=agent.users_max_priority)
        for user, key in agent.users.items():
            inputs.user_id(user, "a published user's name")
            there = await hop(self._services.store.add_published_user, user, key, settings)
            if not there:
                log.info(
                    "published user removed: not added", extra={"action": "users", "user": user}
                )

    # -- requests, versions, counts ------------------------------------------------------------

    @opens
    async def pending_approvals(self, *, after: str | None = None, limit: int = 100) -> Inbox:
        """Every open request, whoever may decide it (``tether approvals list``), paged as
        ``Engine.pending_approvals``."""
        return await inbox.pending_approvals(self._services, None, after=after, limit=limit)

    @opens
    async def audit_records(
        self,
        *,
        after: int = 0,
        limit: int = 1000,
        since: float | None = None,
        user: str | None = None,
    ) -> AuditPage:
        """Every audit record (reference §19) in ``seq`` order, a page of ``limit`` after
        ``after``: at or after ``since`` (epoch seconds), of runs ``user`` owns; what
        ``tether audit export`` writes."""
        after, limit = audit_cursor(after, limit)
        if user is not None:
            inputs.user_id(user, "user")
        records, more = await hop(
            self._services.store.audit_records, after=after, limit=limit, since=since, user=user
        )
        return AuditPage(records=records, more=more)

    @opens
    async def token_owner(self, token: str) -> str | None:
        """The user whose run a token belongs to (pending or used), or None."""
        return await inbox.token_owner(self._services, token)

    @opens
    async def move_run(
        self, run_id: str, to_version: str, *, user: str, why: str | None = None
    ) -> Run:
        """Move a waiting run to agent version ``to_version`` deliberately, by ``user``
        (reference §12)."""
        return await versions.move_run(self._services, run_id, to_version, by=user, why=why)

    @opens
    async def stranded_runs(self, limit: int = 100) -> list[Run]:
        """Runs waiting on an agent version no live worker serves (reference §12)."""
        return await versions.stranded(self._services, limit)

    @opens
    async def count_stranded(self) -> int:
        """How many runs are stranded (the ``tether_runs_stranded`` gauge)."""
        return await versions.count_stranded(self._services)

    @opens
    async def live_workers(self) -> list[str]:
        """The ids (``host:pid:suffix``) of the worker processes whose heartbeat in the
        registry is fresh, fleet-wide: one per process that carries runs."""
        return await versions.live_workers(self._services)

    @opens
    async def counts_by_state(self) -> dict[str, int]:
        """How many runs are in each state, fleet-wide (every state present)."""
        return await hop(self._services.store.count_by_state)

    @opens
    async def counts_waiting(self) -> dict[str, int]:
        """How many runs wait by why (reference §13): fleet-wide, their thread, their start
        time, their user's cap (this engine's ``max_active_per_user``); in this process,
        the model's rate limit (``rate_limit``)."""
        cap = self._services.settings.max_active_per_user
        counts = await hop(self._services.store.count_waiting, cap)
        return {**counts, "rate_limit": self._services.limiter.waiting}

    # -- the keys stored content is sealed with ----------------------------------------------

    @opens
    async def rotate_keys(
        self, *, batch: int = 500, progress: Callable[[str, int], None] | None = None
    ) -> Rotation:
        """Re-seal every stored value under the first key of ``TETHER_ENCRYPTION_KEYS``
        (reference §20), a batch per transaction, while workers run; the ids no value is
        sealed with any more leave the database's list. Safe to run again after a crash.
        ``invalid_config`` without keys, or naming a key a stored value needs."""
        keyring = self._services.settings.keyring
        if keyring is None:
            raise ConfigError("TETHER_ENCRYPTION_KEYS is not set: there is no key to rotate to")
        if not 1 <= batch <= 10_000:
            raise InvalidInput(f"batch must be from 1 to 10000, got {batch}")
        store = self._services.store
        rest = store.dialect.rest_after_batch
        done = await hop(rotate, store.engine, keyring, batch=batch, rest=rest, progress=progress)
        log.info("keys rotated", extra={"action": "rotate_keys", **done.to_json()})
        return done


async def _batch(
    erase: Callable[[str, int], T], user: str, batch: int, rest: Dialect, size: Callable[[T], int]
) -> T:
    """One batch of an erasure (``erase``; ``size``: how many rows it deleted), then, if it
    deleted any, its failpoint after its commit and a rest of the backend's share of its
    time (``Dialect.rest_after_batch``), so other processes' writers are not starved by
    the next batch."""
    start = time.monotonic()
    done = await hop(erase, user, batch)
    if size(done):
        failpoints.fail("after_erasure_batch")
        await asyncio.sleep((time.monotonic() - start) * rest.rest_after_batch)
    return done


def _rows(gone: tuple[int, int]) -> int:
    return gone[0]


def _settings(max_priority: int | None, retention_days: float | None) -> UserSettings:
    """The settings given, validated (``invalid_input`` for a bad one)."""
    bound = None if max_priority is None else inputs.max_priority(max_priority)
    days = None if retention_days is None else inputs.retention_days(retention_days)
    return UserSettings(max_priority=bound, retention_days=days)
