"""The webhook notifier: POSTs each suspension notice as JSON to ``TETHER_WEBHOOK_URL``."""

from __future__ import annotations

import asyncio
import logging
import ssl

import httpx

from tether.notify import Notice

log = logging.getLogger(__name__)
# One TLS context for every notice (httpx builds a new one per client otherwise).
TLS = ssl.create_default_context()


class WebhookNotifier:
    """Posts notices with a few retries; a notice that cannot be delivered is logged (the
    suspension itself is durable and can be shown from the store)."""

    def __init__(self, url: str, *, attempts: int = 4, timeout_s: float = 5.0) -> None:
        self.url = url
        self.attempts = attempts
        self.timeout_s = timeout_s

    async def send(self, notice: Notice) -> bool:
        delay = 0.2
        async with httpx.AsyncClient(timeout=self.timeout_s, verify=TLS) as client:
            for attempt in range(1, self.attempts + 1):
                try:
                    response = await client.post(self.url, json=notice.to_json())
                    if response.status_code < 500:
                        response.raise_for_status()
                        return True
                except httpx.HTTPStatusError:
                    log.error(
                        "webhook refused the notice",
                        extra={"run_id": notice.run_id, "action": "webhook"},
                    )
                    return False
                except httpx.HTTPError:
                    pass
                if attempt < self.attempts:
                    await asyncio.sleep(delay)
                    delay *= 2
        log.error("webhook unreachable", extra={"run_id": notice.run_id, "action": "webhook"})
        return False
