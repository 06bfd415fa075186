"""The reaper's upkeep: suspension notices never delivered sent again, suspensions past
their window halted, runs past retention purged. Each says why running it twice is safe.
"""

from __future__ import annotations

import logging

from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.notify import Notice
from tether.runs import iso
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
        token = fresh[call.token_hash]
        notice = Notice(
            run_id=run.id,
            user_id=run.user_id,
            token=token,
            approve_url=services.approve_url(token),
            tool=call.pending.tool,
            arguments=call.pending.arguments,
            preview=call.pending.preview,
            expires_at=iso(run.expires_at) or "",
            tool_call_id=call.pending.tool_call_id,
            pending_calls=len(run.pending_calls),
            root_run_id=run.root_run_id,
            parent_run_id=run.parent_run_id,
        )
        await services.outbox.post(notice)
    return list(dict.fromkeys(run.id for run, _ in reissued))


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
    """Delete runs halted or finished longer ago than the retention, in bounded batches.
    Safe twice: a deleted run is simply not found again."""
    total = 0
    while True:
        count = await hop(
            services.store.purge_retained,
            services.settings.retention_s,
            services.settings.purge_batch,
        )
        total += count
        if count < services.settings.purge_batch:
            return total
