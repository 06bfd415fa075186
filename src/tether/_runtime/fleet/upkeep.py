"""The reaper's upkeep: suspension notices never delivered sent again, suspensions past
their window halted, runs past retention purged. Each says why running it twice is safe.
"""

from __future__ import annotations

import logging

from tether._runtime.fleet.escalations import notice_of, reissue_escalations
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.telemetry.metrics import EXPIRIES
from tether.tokens import hash_token, new_token

log = logging.getLogger(__name__)


async def reissue_notices(services: Services) -> list[str]:
    """Re-send suspension notices that were never delivered (the process died between the
    durable suspension and the notice, or the webhook was unreachable), each with a fresh
    token. Only once a notice's delivery window (``notice_timeout_s``) has closed: the
    outbox never sends a notice later than that, so a re-issue never races the notice it
    replaces. Safe twice: each swap is conditional on the undelivered token's hash."""
    fresh: dict[str, str] = {}

    def new_hash() -> str:
        token = new_token()
        fresh[hash_token(token)] = token
        return hash_token(token)

    reissued = await hop(
        services.store.reissue_unnotified,
        older_than_s=max(services.settings.heartbeat_timeout_s, services.settings.notice_timeout_s),
        batch=services.settings.reaper_batch,
        new_hashes=new_hash,
        versions=services.versions,
    )
    for run, call in reissued:
        await services.outbox.post(notice_of(services, run, call, fresh[call.token_hash]))
    escalations = await reissue_escalations(services)  # an escalation's notice too (§19)
    return list(dict.fromkeys([*(run.id for run, _ in reissued), *escalations]))


async def expire_suspended(services: Services) -> list[str]:
    """Halt every suspended run past its window (``suspension_expired``). Safe twice: it
    is a conditional UPDATE on ``state = 'suspended'``."""
    expired: list[str] = []
    while True:
        batch = await hop(
            services.store.expire_suspended,
            services.settings.purge_batch,
            versions=services.versions,
        )
        EXPIRIES.inc(len(batch))
        expired.extend(batch)
        if len(batch) < services.settings.purge_batch:
            return expired


async def purge_retained(services: Services) -> int:
    """Delete runs halted or finished longer ago than the retention (a user's own, else
    TETHER_RETENTION_DAYS; reference §20), in bounded batches, and audit records older
    than theirs (``TETHER_AUDIT_RETENTION_DAYS``, reference §19); how many runs went; and
    forgets the escalations of calls decided in time (reference §19). Safe twice: a
    deleted row is simply not found again."""
    await hop(services.store.forget_escalations)
    while True:
        count = await hop(
            services.store.purge_audit,
            services.settings.audit_retention_s,
            services.settings.purge_batch,
        )
        if count < services.settings.purge_batch:
            break
    own = await hop(services.store.own_retentions)
    total = await _purge(services, services.settings.retention_s, None)
    for user, retention_s in own:
        total += await _purge(services, retention_s, user)
    return total


async def _purge(services: Services, retention_s: float, user: str | None) -> int:
    """Purge in batches the runs of ``user`` (None: of every user without a retention of
    their own) past ``retention_s``; how many went."""
    total = 0
    batch = services.settings.purge_batch
    while True:
        count = await hop(services.store.purge_retained, retention_s, batch, user=user)
        total += count
        if count < batch:
            return total
