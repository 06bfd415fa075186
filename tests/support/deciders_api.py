"""The JSON API in-process (``httpx`` over ASGI) for the deciders' test agent (``deciders.py``,
reference §19): an engine of it on a test's database, the people who decide with their
keys (``boss`` is ``dana``'s approver, ``ann`` and ``bob`` are in finance, ``olga`` on call,
``lead`` named by the escalation, ``eve`` nobody's), and a client on the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import deciders
import httpx

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.notify import Notifier

BASE = "http://tether.test"
PEOPLE = ("dana", "boss", "ann", "bob", "olga", "lead", "eve")


def auth(user: str) -> dict[str, str]:
    """The ``Authorization`` header of ``user``'s key."""
    return {"Authorization": f"Bearer key-of-{user}"}


@dataclass
class DecidersApi:
    engine: Engine
    client: httpx.AsyncClient

    async def suspended(self, user: str = deciders.OWNER) -> tuple[str, list[str]]:
        """A run of ``user``'s suspended on its calls: its id and its notices' tokens."""
        outcome = await self.engine.ask(user, "pay them")
        assert outcome.kind is StopKind.SUSPENDED
        return outcome.run_id, [n.token for n in outcome.notices]

    async def get(self, path: str, user: str) -> Any:
        """The JSON of a GET that must succeed."""
        response = await self.client.get(path, headers=auth(user))
        assert response.status_code == 200, response.text
        return response.json()

    async def decide(self, token: str, user: str, decision: str = "approve") -> httpx.Response:
        return await self.client.post(
            f"/v1/approvals/{token}", json={"decision": decision}, headers=auth(user)
        )

    async def decide_by_run(self, run_id: str, call_id: str, user: str) -> httpx.Response:
        entry = {"tool_call_id": call_id, "decision": "approve"}
        return await self.client.post(
            f"/v1/runs/{run_id}/decisions", json={"decisions": [entry]}, headers=auth(user)
        )


@asynccontextmanager
async def serving(
    url: str, tool: str, *, notifier: Notifier | None = None, **settings: Any
) -> AsyncIterator[DecidersApi]:
    """The app on an engine whose model calls ``tool`` (``pay``, ``wire`` or ``page``) once
    a run, with ``settings``; finance and on-call hold their members."""
    for person in ("ann", "bob"):
        deciders.join(person, "finance")
    deciders.join("olga", "oncall")
    engine = Engine(
        agent=deciders.agent(),
        model=deciders.script(tool),
        settings=Settings(database_url=url, **settings),
        notifier=notifier if notifier is not None else MemoryNotifier(),
    )
    try:
        for person in PEOPLE:
            await engine.operator.add_user(person, f"key-of-{person}")
        transport = httpx.ASGITransport(app=create_app(engine, public_url=BASE))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield DecidersApi(engine=engine, client=client)
    finally:
        engine.close()
