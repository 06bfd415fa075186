"""The inbox's pages in-process (``httpx`` over ASGI) on a real store, for the integration
tests of the web layer: an engine of a test agent with users ``dana`` (the owner),
``boss`` (the approver her scope names) and ``eve`` (neither), and signing in as any of
them with the page's own CSRF token; and a page's words, as a person reads them."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

import agents
import httpx

from tether import Agent, Engine, MemoryNotifier, Model, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.runs import Run

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
TAG = re.compile(r"<[^>]+>")


@dataclass
class Web:
    engine: Engine
    notifier: MemoryNotifier
    keys: dict[str, str]
    app: Any

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://testserver"
        )

    async def suspended(self, question: str = "send b", user: str = "dana") -> tuple[str, str]:
        """A run of ``user`` suspended on its confirmed call, and its token."""
        outcome = await self.engine.ask(user, question)
        assert outcome.kind is StopKind.SUSPENDED
        return outcome.run_id, self.notifier.last(outcome.run_id).token

    async def run(self, run_id: str) -> Run:
        return (await self.engine.get_run(run_id)).run

    async def decisions(self, run_id: str) -> list[dict[str, Any]]:
        """The data of the run's stored decisions, oldest first."""
        return [
            e.data for e in await self.engine.events(run_id) if e.kind in ("approved", "declined")
        ]

    async def kinds(self, run_id: str) -> list[str]:
        """The kinds of the run's stored events, oldest first."""
        return [event.kind for event in await self.engine.events(run_id)]

    def close(self) -> None:
        self.engine.close()


async def web(db_url: str, model: Model | None = None, agent: Agent | None = None) -> Web:
    notifier = MemoryNotifier()
    engine = Engine(
        agent=agent or agents.agent(),
        model=model or agents.script("send"),
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    keys = {name: await engine.operator.add_user(name) for name in ("dana", "boss", "eve")}
    return Web(engine=engine, notifier=notifier, keys=keys, app=create_app(engine))


def words(page: str) -> str:
    """A page's text without its markup, its spaces collapsed: what a person reads."""
    spaced = re.sub(r"\s+", " ", html.unescape(TAG.sub(" ", page)))
    return re.sub(r" ([.,:;)])", r"\1", spaced).strip()  # no space a tag left before them


def csrf_of(page: str) -> str:
    found = CSRF.search(page)
    assert found, "the page has no CSRF field"
    return found.group(1)


async def try_sign_in(client: httpx.AsyncClient, key: str, next_path: str = "/") -> httpx.Response:
    """Post the sign-in form with ``key``, and give back the answer, whatever it is."""
    form = await client.get("/login", params={"next": next_path})
    return await client.post(
        "/login", data={"key": key, "csrf": csrf_of(form.text), "next": next_path}
    )


async def sign_in(client: httpx.AsyncClient, key: str, next_path: str = "/") -> None:
    """Sign in with ``key``, which must be accepted."""
    assert (await try_sign_in(client, key, next_path)).status_code == 303


async def session_csrf(client: httpx.AsyncClient) -> str:
    """The signed-in session's CSRF token, from its inbox page."""
    inbox = await client.get("/")
    assert inbox.status_code == 200
    return csrf_of(inbox.text)
