"""Refusals that say what to do (reference §4, §9), in-process on both backends: an expired
token tells the run's owner, and only the owner, that the run is halted and how to
continue it; a preview is refused past the window as the claim is, before any sweep."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import agents
import downstream
import httpx
import inprocess
import pytest
from waiting import until

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.errors import UnknownOrExpired

KEYS = {"dana": "key-of-dana", "miguel": "key-of-miguel", "boss": "key-of-the-boss"}
GENERIC = {
    "ok": False,
    "error": "unknown_or_expired",
    "message": "this approval link is unknown or has expired",
}
CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Served:
    engine: Engine
    notifier: MemoryNotifier
    client: httpx.AsyncClient

    async def suspended(self) -> tuple[str, str]:
        outcome = await self.engine.ask("dana", "send b")
        assert outcome.kind is StopKind.SUSPENDED
        return outcome.run_id, self.notifier.last(outcome.run_id).token

    async def post(self, path: str, user: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {KEYS[user]}"}
        return await self.client.post(path, json=body or {}, headers=headers)

    async def expire(self, run_id: str) -> None:
        """Wait, by the database's clock, until the run's window has closed."""
        run = (await self.engine.get_run(run_id)).run
        assert run.expires_at is not None
        expires_at = run.expires_at

        async def past() -> bool:
            return await self.engine.now() > expires_at

        await until(past)


@pytest.fixture
async def served(db_url: str) -> AsyncIterator[Served]:
    notifier = MemoryNotifier()
    settings = Settings(database_url=db_url, suspension_ttl_min=0.0005)  # 30 ms
    engine = Engine(
        agent=agents.agent(), model=agents.script("send"), settings=settings, notifier=notifier
    )
    for user, key in KEYS.items():
        await engine.operator.add_user(user, key)
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            yield Served(engine=engine, notifier=notifier, client=c)
    finally:
        engine.close()


def _told_the_owner(body: dict[str, Any], run_id: str, state: str) -> None:
    assert body["error"] == "unknown_or_expired" and body["ok"] is False
    assert body["run_id"] == run_id and body["state"] == state
    assert body["halt_reason"] == "suspension_expired"
    assert f"POST /v1/runs/{run_id}/continue" in body["message"]
    assert f"tether continue {run_id}" in body["message"]


async def test_an_expired_token_tells_its_owner_the_run_is_halted_and_how_to_continue_it(
    served: Served,
) -> None:
    run_id, token = await served.suspended()
    await served.expire(run_id)
    assert await served.engine.runner.expire_suspended() == [run_id]
    decide = {"decision": "approve"}
    for path, body in ((f"/v1/approvals/{token}", decide), (f"/v1/approvals/{token}/preview", {})):
        owner = await served.post(path, "dana", body)
        assert owner.status_code == 404, owner.text
        _told_the_owner(owner.json(), run_id, "halted")
        # Anyone else, a scope approver included, gets the answer an unknown token gets.
        for user in ("miguel", "boss"):
            other = await served.post(path, user, body)
            assert other.status_code == 404 and other.content == owner_free(other)
            assert other.json() == GENERIC
    unknown = await served.post("/v1/approvals/no-such-token", "dana", {"decision": "approve"})
    assert unknown.json() == GENERIC
    # What the CLI does: act as the token's owner, who is told the same.
    assert await served.engine.operator.token_owner(token) == "dana"
    with pytest.raises(UnknownOrExpired) as told:
        await served.engine.resume_after_confirmation(token, "approve", "dana")
    _told_the_owner(told.value.to_dict(), run_id, "halted")
    # The way out it names works: the run is continued and asks again, on a new token.
    continued = await served.post(f"/v1/runs/{run_id}/continue", "dana")
    assert continued.status_code == 200, continued.text
    again = await served.engine.run_until_stop(run_id)
    assert again.kind is StopKind.SUSPENDED
    assert served.notifier.last(run_id).token != token
    assert downstream.effects() == []


def owner_free(response: httpx.Response) -> bytes:
    """The body of a refusal that names no run (byte-for-byte today's)."""
    assert b"run_id" not in response.content
    return response.content


async def test_the_approval_page_tells_only_the_owner_that_the_request_expired(
    served: Served,
) -> None:
    run_id, token = await served.suspended()
    await served.expire(run_id)
    await served.engine.runner.expire_suspended()
    pages = {}
    for user in ("dana", "boss"):
        transport = httpx.ASGITransport(app=create_app(served.engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as web:
            form = await web.get("/login", params={"next": "/"})
            csrf = CSRF.search(form.text)
            assert csrf is not None
            data = {"key": KEYS[user], "csrf": csrf.group(1), "next": "/"}
            await web.post("/login", data=data)
            pages[user] = await web.get(f"/approve/{token}")
    assert pages["dana"].status_code == 404
    assert run_id in pages["dana"].text and f"tether continue {run_id}" in pages["dana"].text
    assert pages["boss"].status_code == 404 and run_id not in pages["boss"].text
    assert "This approval link is unknown or has expired." in pages["boss"].text


async def test_a_preview_past_the_window_is_refused_before_any_sweep(served: Served) -> None:
    run_id, token = await served.suspended()
    await served.expire(run_id)
    # No expiry sweep ran: the run is still suspended, but its window closed by the
    # database's clock, so a preview is refused as the claim is, and calls no tool.
    assert (await served.engine.get_run(run_id)).run.state.value == "suspended"
    for body in ({}, {"arguments": {"item": "c"}}):
        stranger = await served.post(f"/v1/approvals/{token}/preview", "miguel", body)
        assert stranger.status_code == 404 and stranger.json() == GENERIC
        owner = await served.post(f"/v1/approvals/{token}/preview", "dana", body)
        assert owner.status_code == 404, owner.text
        _told_the_owner(owner.json(), run_id, "suspended")
    with pytest.raises(UnknownOrExpired):
        await served.engine.preview_approval(token, "boss")
    decided = await served.post(f"/v1/approvals/{token}", "dana", {"decision": "approve"})
    _told_the_owner(decided.json(), run_id, "suspended")
    assert (await served.engine.get_run(run_id)).run.state.value == "suspended"


async def test_an_approved_write_that_ran_has_its_result_in_the_run_events_as_any_call(
    db_url: str,
) -> None:
    # A write no human decided: its result is a ``tool_result`` event.
    work = inprocess.engine(db_url, script_name="work")
    try:
        plain = await work.ask("dana", "work")
        assert plain.kind is StopKind.ANSWERED
        events = [e async for e in work.watch(plain.run_id)]
        results = [e.data for e in events if e.kind == "tool_result"]
        assert {"tool": "record", "tool_call_id": "call_1_0", "status": "ok"} in results
    finally:
        work.close()
    # An approved one, the same, in its run's stream between the approval and the answer.
    notifier = MemoryNotifier()
    sending = inprocess.engine(db_url, script_name="send", notifier=notifier)
    try:
        outcome = await sending.ask("dana", "send b")
        run_id = outcome.run_id
        token = notifier.last(run_id).token
        approved = await sending.resume_after_confirmation(token, "approve", "dana")
        assert approved.outcome.value == "executed"
        await sending.run_until_stop(run_id)
        seen = [e async for e in sending.watch(run_id, user="dana")]
    finally:
        sending.close()
    (result,) = [e.data for e in seen if e.kind == "tool_result"]
    assert result == {"tool": "send", "tool_call_id": "call_0_0", "status": "ok"}
    kinds = [e.kind for e in seen]
    assert kinds.index("approved") < kinds.index("tool_result") < kinds.index("answered")
    assert downstream.effects(f"{run_id}:call_0_0") == [(f"{run_id}:call_0_0", "send", "b")]
