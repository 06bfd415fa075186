"""Four eyes (reference §4, §9): a tool declared ``approvers="others"`` has its calls decided
by someone other than the run's owner, on both backends. The owner is refused with
``four_eyes`` (403) by token, by run, in a preview of an edit, over HTTP and in the inbox,
and nothing changes (the token still works); the inbox shows the owner the request as
waiting on someone else, with no decision form; an approver of the owner's scope decides
it; a stranger still learns nothing (``unknown_or_expired``); a tool without the rule
keeps today's (the owner may decide).

No worker runs here: the tests carry runs with ``engine.run_until_stop``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import agents
import downstream
import httpx
import pytest

from tether import Approvers, Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.approvals.inbox import may_decide
from tether.config import Settings
from tether.errors import FourEyes, UnknownOrExpired
from tether.runs import RunState

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
WAITING = "Waiting for someone else"


class FourEyesKit:
    def __init__(self, engine: Engine, notifier: MemoryNotifier, keys: dict[str, str]) -> None:
        self.engine, self.notifier, self.keys = engine, notifier, keys
        self.digest: str | None = None

    async def suspended(self) -> tuple[str, str, str]:
        """A run of dana's suspended on a ``transfer``: its id, token and call id (and in
        ``self.digest`` its preview's digest)."""
        outcome = await self.engine.ask("dana", "transfer b")
        assert outcome.kind is StopKind.SUSPENDED
        run = (await self.engine.get_run(outcome.run_id)).run
        assert run.pending is not None and run.pending.tool == "transfer"
        self.digest = run.pending.digest
        return run.id, self.notifier.last(run.id).token, run.pending.tool_call_id

    async def unchanged(self, run_id: str) -> tuple[Any, ...]:
        run = (await self.engine.get_run(run_id)).run
        events = [e.kind for e in await self.engine.events(run_id)]
        return (run.state, run.updated_at, run.pending_token_hash, run.lease_epoch, events)

    def client(self) -> httpx.AsyncClient:
        app = create_app(self.engine, public_url="http://testserver")
        transport = httpx.ASGITransport(app=app)
        return httpx.AsyncClient(transport=transport, base_url="http://testserver")


@pytest.fixture
async def kit(db_url: str) -> AsyncIterator[FourEyesKit]:
    notifier = MemoryNotifier()
    engine = Engine(
        agent=agents.four_eyes_agent(),
        model=agents.four_eyes_script("transfer"),
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    keys = {name: await engine.operator.add_user(name) for name in ("dana", "boss", "eve")}
    try:
        yield FourEyesKit(engine, notifier, keys)
    finally:
        engine.close()


async def test_the_owner_cannot_decide_a_four_eyes_call_and_an_approver_then_can(
    kit: FourEyesKit,
) -> None:
    engine = kit.engine
    run_id, token, call = await kit.suspended()
    before = await kit.unchanged(run_id)
    for decision in ("approve", "decline"):
        with pytest.raises(FourEyes) as refused:
            await engine.resume_after_confirmation(token, decision, "dana")
        assert refused.value.details == {"tool": "transfer"}
        assert "transfer" in refused.value.message and "owner" in refused.value.message
        with pytest.raises(FourEyes):
            await engine.web.resume_by_run(
                run_id, decision, "dana", tool_call_id=call, shown_digest=kit.digest
            )
    with pytest.raises(FourEyes):  # previews take the same authorisation as deciding
        await engine.preview_approval(token, "dana", {"item": "c"})
    with pytest.raises(FourEyes):
        await engine.web.preview_by_run(run_id, "dana", tool_call_id=call)
    # Someone the scope does not name still learns nothing, four eyes or not.
    with pytest.raises(UnknownOrExpired):
        await engine.resume_after_confirmation(token, "approve", "eve")
    assert await kit.unchanged(run_id) == before and downstream.effects() == []

    assert await may_decide(engine.runner.services, "dana", "dana")  # the owner sees the request...
    assert not await may_decide(
        engine.runner.services, "dana", "dana", tool="transfer"
    )  # ...not to decide
    assert await may_decide(engine.runner.services, "dana", "boss", tool="transfer")
    assert not await may_decide(engine.runner.services, "dana", "eve", tool="transfer")

    result = await engine.resume_after_confirmation(token, "approve", "boss")
    assert result.outcome.value == "executed"
    assert [e[1] for e in downstream.effects()] == ["transfer"]
    (approved,) = [e.data for e in await engine.events(run_id) if e.kind == "approved"]
    assert approved["by"] == "boss"


async def test_a_tool_without_the_rule_keeps_todays_the_owner_may_decide(
    kit: FourEyesKit,
) -> None:
    send = kit.engine.agent.tool("send")
    assert send is not None and send.approvers is Approvers.ANY
    engine = Engine(
        agent=agents.four_eyes_agent(),
        model=agents.four_eyes_script("send"),
        settings=kit.engine.settings,
        notifier=kit.notifier,
    )
    try:
        outcome = await engine.ask("dana", "send b")
        assert outcome.kind is StopKind.SUSPENDED
        token = kit.notifier.last(outcome.run_id).token
        result = await engine.resume_after_confirmation(token, "approve", "dana")
        assert result.outcome.value == "executed"
    finally:
        engine.close()


async def test_over_http_the_owner_gets_four_eyes_403_and_nothing_changes(
    kit: FourEyesKit,
) -> None:
    run_id, token, _ = await kit.suspended()
    before = await kit.unchanged(run_id)
    dana = {"Authorization": f"Bearer {kit.keys['dana']}"}
    boss = {"Authorization": f"Bearer {kit.keys['boss']}"}
    async with kit.client() as client:
        refused = await client.post(
            f"/v1/approvals/{token}", json={"decision": "approve"}, headers=dana
        )
        assert refused.status_code == 403, refused.text
        assert refused.json() == {
            "ok": False,
            "error": "four_eyes",
            "message": refused.json()["message"],
            "tool": "transfer",
        }
        preview = await client.post(f"/v1/approvals/{token}/preview", json={}, headers=dana)
        assert preview.status_code == 403 and preview.json()["error"] == "four_eyes"
        assert await kit.unchanged(run_id) == before
        # The list names the owner's own four-eyes call as one they may not decide.
        (mine,) = (await client.get("/v1/approvals", headers=dana)).json()["items"]
        (theirs,) = (await client.get("/v1/approvals", headers=boss)).json()["items"]
        assert (mine["run_id"], mine["may_decide"]) == (run_id, False)
        assert (theirs["run_id"], theirs["may_decide"]) == (run_id, True)
        done = await client.post(
            f"/v1/approvals/{token}", json={"decision": "approve"}, headers=boss
        )
    assert done.status_code == 200, done.text
    assert [e[1] for e in downstream.effects()] == ["transfer"]


async def _sign_in(client: httpx.AsyncClient, key: str) -> str:
    """Sign in with ``key``; the session's CSRF token."""
    form = await client.get("/login", params={"next": "/"})
    found = CSRF.search(form.text)
    assert found
    await client.post("/login", data={"key": key, "csrf": found.group(1), "next": "/"})
    inbox = await client.get("/")
    found = CSRF.search(inbox.text)
    assert inbox.status_code == 200 and found
    return found.group(1)


async def test_the_inbox_shows_the_owner_the_request_waiting_on_someone_else(
    kit: FourEyesKit,
) -> None:
    run_id, token, call = await kit.suspended()
    before = await kit.unchanged(run_id)
    async with kit.client() as client:
        csrf = await _sign_in(client, kit.keys["dana"])
        for path in ("/", f"/approve/{token}", f"/runs/{run_id}"):
            shown = await client.get(path)
            assert shown.status_code == 200, path
            assert "<code>transfer</code>" in shown.text and WAITING in shown.text, path
            assert 'value="approve"' not in shown.text and "Edit the arguments" not in shown.text
        refused = await client.post(f"/approve/{token}", data={"decision": "approve", "csrf": csrf})
        assert refused.status_code == 403 and "someone other than" in refused.text
        fields = {"tool_call_id": call, "digest": kit.digest or "", "csrf": csrf}
        by_run = await client.post(
            f"/runs/{run_id}/decision", data={**fields, "decision": "decline"}
        )
        assert by_run.status_code == 403
        edit = await client.post(f"/approve/{token}/preview", data={"item": "c", "csrf": csrf})
        assert edit.status_code == 403
    assert await kit.unchanged(run_id) == before and downstream.effects() == []

    async with kit.client() as client:
        csrf = await _sign_in(client, kit.keys["boss"])
        inbox = await client.get("/")
        assert f'id="run-{run_id}"' in inbox.text and WAITING not in inbox.text
        assert 'value="approve"' in inbox.text
        done = await client.post(f"/approve/{token}", data={"decision": "approve", "csrf": csrf})
    assert done.status_code == 200 and "Approved" in done.text
    assert (await kit.engine.get_run(run_id)).run.state is not RunState.SUSPENDED
    assert [e[1] for e in downstream.effects()] == ["transfer"]
