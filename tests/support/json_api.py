"""The JSON API (reference §6) in-process (``httpx`` over ASGI) on a real store, for the
integration tests of its endpoints: an engine of the test agent with users ``dana``,
``miguel`` and ``boss`` (an approver in the test agent's scope) and their keys, a client
on the app, the refusal shape every error answers with, a fingerprint of everything a
request could change, and a metric's samples from ``/metrics``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import agents
import httpx
from prometheus_client.parser import text_string_to_metric_families

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings

BASE = "http://tether.test"
BOSS_KEY = "key-of-the-boss"  # `boss` is an approver in the test agent's scope
KEYS = {"dana": "key-of-dana", "miguel": "key-of-miguel", "boss": BOSS_KEY}
DANA = {"Authorization": f"Bearer {KEYS['dana']}"}
MIGUEL = {"Authorization": f"Bearer {KEYS['miguel']}"}
BOSS = {"Authorization": f"Bearer {BOSS_KEY}"}
ERROR_KEYS = {"ok", "error", "message"}


@dataclass
class Api:
    engine: Engine
    notifier: MemoryNotifier
    client: httpx.AsyncClient

    async def start(self, headers: dict[str, str] = DANA, **body: Any) -> str:
        response = await self.client.post(
            "/v1/runs", json={"question": "send b", **body}, headers=headers
        )
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def suspended(self) -> tuple[str, str]:
        """A run of dana's suspended on its send, and the token of its notice."""
        run_id = await self.start()
        outcome = await self.engine.run_until_stop(run_id)
        assert outcome.kind is StopKind.SUSPENDED
        return run_id, self.notifier.last(run_id).token

    async def run(self, run_id: str, headers: dict[str, str] = DANA) -> dict[str, Any]:
        response = await self.client.get(f"/v1/runs/{run_id}", headers=headers)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def decide(
        self, token: str, decision: str = "approve", headers: dict[str, str] = DANA
    ) -> httpx.Response:
        return await self.client.post(
            f"/v1/approvals/{token}", json={"decision": decision}, headers=headers
        )


async def build_engine(
    url: str, script: str, notifier: MemoryNotifier, *, auth_max_failures: int = 10
) -> Engine:
    engine = Engine(
        agent=agents.agent(),
        model=agents.script(script),
        settings=Settings(database_url=url, auth_max_failures=auth_max_failures),
        notifier=notifier,
    )
    for user, key in KEYS.items():
        await engine.operator.add_user(user, key)
    return engine


@asynccontextmanager
async def serving(
    url: str, script: str = "send", *, auth_max_failures: int = 10
) -> AsyncIterator[Api]:
    notifier = MemoryNotifier()
    engine = await build_engine(url, script, notifier, auth_max_failures=auth_max_failures)
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            yield Api(engine=engine, notifier=notifier, client=c)
    finally:
        engine.close()


def refused(
    response: httpx.Response, status: int, code: str, extras: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Assert a refusal: its status, its code, and exactly the documented keys."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == ERROR_KEYS | set(extras), body
    assert body["ok"] is False and body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"], body
    return body


async def fingerprint(engine: Engine) -> list[tuple[Any, ...]]:
    """Everything a request could change about the stored runs."""
    return [
        (
            r.id,
            r.state.value,
            r.updated_at,
            r.message_count,
            r.lease_epoch,
            r.owner,
            len(await engine.events(r.id)),
        )
        for r in await engine.list_runs(None, limit=1000)
    ]


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of the metric ``name`` in a ``/metrics`` text, by their labels."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }
