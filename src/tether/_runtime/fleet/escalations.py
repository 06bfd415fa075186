"""Escalating calls nobody decided in time (reference §19), and their notices.

A pass escalates every call that is due by the database's clock and still undecided
(``store.escalate_due``: once fleet-wide, each escalation conditional on the call not
being escalated yet), then sends each its notice, ``"escalated": true``, carrying the
second token the escalation gave the call, to the people it is escalated to. A notice the
process did not deliver (it died after the escalation was durable: failpoint
``after_escalated``; or the webhook failed) goes out again with a fresh second token once
its delivery window has closed, as a suspension's notice does.
"""

from __future__ import annotations

from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.failpoints import fail
from tether.notify import Notice
from tether.runs import PendingCall, Run, iso
from tether.store.escalations import Escalated
from tether.tokens import hash_token, new_token


def escalate_to(services: Services, tool: str) -> tuple[str, ...]:
    """Whom calls of ``tool`` are escalated to (any agent of the served tree)."""
    for agent in services.agent.tree.values():
        found = agent.tool(tool)
        if found is not None:
            return found.escalate_to
    return ()


def notice_of(
    services: Services, run: Run, call: PendingCall, token: str, *, escalated: bool = False
) -> Notice:
    """The notice of ``call`` of ``run``'s suspension, carrying ``token``; an escalation's
    says so and names whom it is escalated to."""
    pending = call.pending
    return Notice(
        run_id=run.id,
        user_id=run.user_id,
        token=token,
        approve_url=services.approve_url(token),
        tool=pending.tool,
        arguments=pending.arguments,
        preview=pending.preview,
        expires_at=iso(run.expires_at) or "",
        tool_call_id=pending.tool_call_id,
        pending_calls=len(run.pending_calls),
        root_run_id=run.root_run_id,
        parent_run_id=run.parent_run_id,
        quorum=pending.quorum,
        escalated=escalated,
        escalate_to=escalate_to(services, pending.tool) if escalated else (),
    )


async def escalate_due(services: Services) -> list[str]:
    """Escalate the calls due now, in batches, and send their notices; the ids of the runs
    whose calls were escalated. Safe twice and beside other workers' passes: a call is
    escalated by whichever pass finds it first."""
    due_in = await hop(services.store.next_escalation_in, services.versions)
    if due_in is None or due_in > 0:  # one read, not a write transaction, when none is due
        return []
    escalated: list[Escalated] = []
    fresh: dict[str, str] = {}

    def new_hash() -> str:
        token = new_token()
        fresh[hash_token(token)] = token
        return hash_token(token)

    while True:
        batch = await hop(
            services.store.escalate_due,
            batch=services.settings.reaper_batch,
            new_hashes=new_hash,
            escalate_to=lambda tool: escalate_to(services, tool),
            versions=services.versions,
        )
        escalated.extend(batch)
        if batch:
            fail("after_escalated", batch[0].call.pending.tool)
        for done in batch:
            notice = notice_of(
                services, done.run, done.call, fresh[done.alias_hash], escalated=True
            )
            await services.outbox.post(notice)
        if len(batch) < services.settings.reaper_batch:
            return list(dict.fromkeys(e.run.id for e in escalated))


async def reissue_escalations(services: Services) -> list[str]:
    """Send again, each with a fresh second token, the escalation notices not delivered
    within their delivery window; the ids of their runs."""
    fresh: dict[str, str] = {}

    def new_hash() -> str:
        token = new_token()
        fresh[hash_token(token)] = token
        return hash_token(token)

    settings = services.settings
    reissued = await hop(
        services.store.reissue_escalations,
        older_than_s=max(settings.heartbeat_timeout_s, settings.notice_timeout_s),
        batch=settings.reaper_batch,
        new_hashes=new_hash,
        versions=services.versions,
    )
    for done in reissued:
        notice = notice_of(services, done.run, done.call, fresh[done.alias_hash], escalated=True)
        await services.outbox.post(notice)
    return list(dict.fromkeys(e.run.id for e in reissued))
