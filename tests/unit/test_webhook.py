"""The webhook notifier (``tether.webhook``): it posts a notice with retries, and says
whether it was delivered. A lost notice re-issued by the reaper is
tests/integration/test_notices.py."""

from __future__ import annotations

from webhooks import Flaky

from tether.notify import Notice
from tether.webhook import WebhookNotifier

NOTICE = Notice(
    run_id="r1",
    user_id="dana",
    token="t",
    approve_url="/approve/t",
    tool="send",
    arguments={"item": "b"},
    preview={"item": "b"},
    expires_at="2026-11-29T00:00:00+00:00",
)


async def test_the_webhook_retries_until_delivered() -> None:
    hook = Flaky(failures=2)
    try:
        assert await WebhookNotifier(hook.url, attempts=4).send(NOTICE) is True
        assert hook.received == [NOTICE.to_json()]
    finally:
        hook.close()


async def test_the_webhook_gives_up_and_says_so() -> None:
    hook = Flaky(failures=10)
    try:
        assert await WebhookNotifier(hook.url, attempts=2).send(NOTICE) is False
        assert hook.received == []
    finally:
        hook.close()
