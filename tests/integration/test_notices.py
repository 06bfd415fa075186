"""Suspension notices: the webhook posts with retries, and a notice that was never
delivered is re-issued by the reaper with a fresh token."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import inprocess
import pytest
from waiting import until

from tether import StopKind
from tether.errors import UnknownOrExpired
from tether.notify import Notice
from tether.webhook import WebhookNotifier


class Flaky:
    """A webhook receiver that answers 503 ``failures`` times, then 204."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.received: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.failures > 0:
                    outer.failures -= 1
                    self.send_response(503)
                else:
                    outer.received.append(body)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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


async def test_an_undelivered_notice_is_reissued_with_a_fresh_token(db_url: str) -> None:
    hook = Flaky(failures=100)
    engine = inprocess.engine(
        db_url,
        script_name="send",
        notifier=WebhookNotifier(hook.url, attempts=1),
        heartbeat_timeout_s=0.05,
    )
    try:
        outcome = await engine.ask("dana", "send")
        assert outcome.kind is StopKind.SUSPENDED and outcome.notice is not None
        lost_token = outcome.notice.token
        await engine._services.outbox.drain(10)  # the one attempt was made, and refused
        assert hook.received == []
        run = engine._store.get_run(outcome.run_id)
        assert run is not None
        await until(lambda: engine._store.now() - (run.suspended_at or 0) > 0.1)
        hook.failures = 0
        summary = await engine.reap()
        assert summary.notices_reissued == [outcome.run_id]
        await engine._services.outbox.drain(10)
        assert len(hook.received) == 1
        fresh = hook.received[0]["token"]
        assert fresh != lost_token
        with pytest.raises(UnknownOrExpired):
            await engine.resume_after_confirmation(lost_token, "approve", "dana")
        assert (await engine.resume_after_confirmation(fresh, "approve", "dana")).ok
        assert (await engine.reap()).notices_reissued == []
    finally:
        engine.close()
        hook.close()
