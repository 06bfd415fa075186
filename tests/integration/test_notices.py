"""Suspension notices: a notice that was never delivered is re-issued by the reaper with a
fresh token. The webhook's own retries are tests/unit/test_webhook.py."""

from __future__ import annotations

import inprocess
import pytest
from waiting import until
from webhooks import Flaky

from tether import StopKind
from tether.errors import UnknownOrExpired
from tether.webhook import WebhookNotifier

# A notice's delivery window: the re-issued notice must reach the local hook within it,
# which a loaded machine (CI runs the suite on two cores) does not do in 50 ms.
WINDOW_S = 1.0


async def test_an_undelivered_notice_is_reissued_with_a_fresh_token(db_url: str) -> None:
    hook = Flaky(failures=100)
    engine = inprocess.engine(
        db_url,
        script_name="send",
        notifier=WebhookNotifier(hook.url, attempts=1),
        heartbeat_timeout_s=0.05,
        notice_timeout_s=WINDOW_S,
    )
    try:
        outcome = await engine.ask("dana", "send")
        assert outcome.kind is StopKind.SUSPENDED and outcome.notice is not None
        lost_token = outcome.notice.token
        await engine.runner.services.outbox.drain(10)  # the one attempt was made, and refused
        assert hook.received == []
        run = engine.runner.store.get_run(outcome.run_id)
        assert run is not None
        await until(lambda: engine.runner.store.now() - (run.suspended_at or 0) > WINDOW_S)
        hook.failures = 0
        summary = await engine.operator.reap()
        assert summary.notices_reissued == [outcome.run_id]
        await engine.runner.services.outbox.drain(10)
        assert len(hook.received) == 1
        fresh = hook.received[0]["token"]
        assert fresh != lost_token
        with pytest.raises(UnknownOrExpired):
            await engine.resume_after_confirmation(lost_token, "approve", "dana")
        assert (await engine.resume_after_confirmation(fresh, "approve", "dana")).ok
        assert (await engine.operator.reap()).notices_reissued == []
    finally:
        engine.close()
        hook.close()


async def test_every_notice_link_starts_with_the_public_url_of_the_settings(db_url: str) -> None:
    """The first notice and the reaper's re-issue alike: the link is built in one place,
    from ``TETHER_PUBLIC_URL``, whichever process sends the notice."""
    hook = Flaky(failures=1)
    engine = inprocess.engine(
        db_url,
        script_name="send",
        notifier=WebhookNotifier(hook.url, attempts=1),
        heartbeat_timeout_s=0.05,
        notice_timeout_s=WINDOW_S,
        public_url="https://tether.example.com/ops",
    )
    try:
        outcome = await engine.ask("dana", "send")
        assert outcome.notice is not None
        first = outcome.notice
        assert first.approve_url == f"https://tether.example.com/ops/approve/{first.token}"
        await engine.runner.services.outbox.drain(10)  # refused: the reaper re-issues it
        run = engine.runner.store.get_run(outcome.run_id)
        assert run is not None
        await until(lambda: engine.runner.store.now() - (run.suspended_at or 0) > WINDOW_S)
        assert (await engine.operator.reap()).notices_reissued == [outcome.run_id]
        await engine.runner.services.outbox.drain(10)
        [reissued] = hook.received
        assert reissued["approve_url"] == (
            f"https://tether.example.com/ops/approve/{reissued['token']}"
        )
    finally:
        engine.close()
        hook.close()
