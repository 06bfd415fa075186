"""The demo agent's tools against a real sandbox CRM, on both stores: the send's preview,
its guard and permission re-checks, the manager's approval, and reconciliation by key."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from demo_procs import ORDER, PREVIEW_KEYS, closed_url, crm_context

from tether import Engine, MemoryNotifier, Scope, ScriptedModel, Settings, StopKind, ToolContext
from tether.agent import Agent
from tether.demo.agent import (
    DEMO_TURNS,
    build_agent,
    draft_quote,
    find_account,
    reconcile_draft,
    scope_resolver,
)
from tether.demo.crm import Crm
from tether.errors import NoLongerPermitted, UnknownOrExpired
from tether.sandbox import RunningSandbox
from tether.tools.tool import ReconcileKind, ToolFailed

QUESTION = "Draft and send a quote for Henderson: 200 of SKU-4411."


@pytest.fixture
def crm(sandbox_server: RunningSandbox) -> Iterator[httpx.Client]:
    """The sandbox's admin endpoints, the sandbox back at its seed."""
    with httpx.Client(base_url=sandbox_server.url, timeout=10) as client:
        client.post("/admin/reset").raise_for_status()
        yield client


@pytest.fixture
def agent(sandbox_server: RunningSandbox) -> Agent:
    """The demo agent, its tools pointed at the session's sandbox through its settings."""
    return build_agent(Settings(sandbox_url=sandbox_server.url))


@pytest.fixture
def notifier() -> MemoryNotifier:
    return MemoryNotifier()


@pytest.fixture
def engine(
    db_url: str, agent: Agent, crm: httpx.Client, notifier: MemoryNotifier
) -> Iterator[Engine]:
    built = Engine(
        agent=agent,
        model=ScriptedModel(DEMO_TURNS),
        settings=Settings(database_url=db_url),
        notifier=notifier,
    )
    yield built
    built.close()


def counts(crm: httpx.Client) -> tuple[int, int]:
    body = crm.get("/admin/quotes", params={"account_id": "4471"}).json()
    return body["drafted"], body["sent"]


def tool_results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Each tool result by the name of the tool that produced it (the latest wins)."""
    names = {
        call["id"]: call["function"]["name"]
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    }
    return {
        names[m["tool_call_id"]]: json.loads(m["content"]) for m in messages if m["role"] == "tool"
    }


async def test_send_quote_suspends_with_exactly_the_spec_preview(
    engine: Engine, notifier: MemoryNotifier, crm: httpx.Client
) -> None:
    outcome = await engine.ask("dana", QUESTION)

    assert outcome.kind is StopKind.SUSPENDED
    notice = notifier.last(outcome.run_id)
    assert notice.tool == "send_quote"
    assert notice.preview is not None
    assert set(notice.preview) == PREVIEW_KEYS
    assert notice.preview["account_name"] == "Henderson"
    assert notice.preview["discount_tier"] == "silver"
    assert notice.preview["lines"] == [{"sku": "SKU-4411", "quantity": 200, "unit_price": 11.88}]
    assert notice.preview["total"] == 2376.0
    run = (await engine.get_run(outcome.run_id)).run
    assert run.pending is not None
    assert run.pending.preview == notice.preview
    assert run.pending.arguments == {"quote_id": notice.preview["quote_id"]}
    assert counts(crm) == (1, 0)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"credit_hold": True}, "on credit hold"),
        ({"discount_tier": "platinum"}, "above your limit of 10%"),
    ],
)
async def test_the_guard_refuses_a_send_the_crm_would_regret(
    engine: Engine, crm: httpx.Client, change: dict[str, Any], reason: str
) -> None:
    crm.patch("/admin/accounts/4471", json=change).raise_for_status()

    outcome = await engine.ask("dana", QUESTION)

    # Refused before asking anyone: the model gets the refusal and answers.
    assert outcome.kind is StopKind.ANSWERED
    view = await engine.get_run(outcome.run_id)
    refusal = tool_results(view.messages)["send_quote"]
    assert refusal["error"] == "guard_failed"
    assert reason in refusal["message"]
    assert [e.status.value for e in await engine.ledger(outcome.run_id)][-1] == "error"
    assert counts(crm) == (1, 0)


async def test_a_revoked_send_permission_is_no_longer_permitted_on_approval(
    engine: Engine, notifier: MemoryNotifier, crm: httpx.Client
) -> None:
    outcome = await engine.ask("dana", QUESTION)
    assert outcome.kind is StopKind.SUSPENDED
    crm.patch("/admin/users/dana/permissions", json={"can_send_quotes": False}).raise_for_status()

    with pytest.raises(NoLongerPermitted):
        await engine.resume_after_confirmation(notifier.last().token, "approve", "dana")

    run = (await engine.get_run(outcome.run_id)).run
    assert run.state.value == "halted"
    assert run.halt_reason == "no_longer_permitted"
    assert run.scope_snapshot["permissions"]["can_send_quotes"] is False
    assert counts(crm) == (1, 0)


async def test_her_manager_may_approve_danas_send_and_a_stranger_may_not(
    engine: Engine, notifier: MemoryNotifier, crm: httpx.Client
) -> None:
    outcome = await engine.ask("dana", QUESTION)
    token = notifier.last().token

    with pytest.raises(UnknownOrExpired):
        await engine.resume_after_confirmation(token, "approve", "eve")
    result = await engine.resume_after_confirmation(token, "approve", "miguel")

    assert result.ok
    final = await engine.run_until_stop(outcome.run_id)
    assert final.kind is StopKind.ANSWERED
    quotes = crm.get("/admin/quotes", params={"account_id": "4471"}).json()["quotes"]
    assert [(q["status"], q["sent_by"]) for q in quotes] == [("sent", "dana")]
    assert quotes[0]["sent_key"] == f"{outcome.run_id}:call_3_0"


@pytest.mark.parametrize("kind", ["crash_after_commit", "fail_before_commit"])
async def test_a_draft_whose_answer_was_lost_is_reconciled_to_exactly_one_quote(
    engine: Engine, notifier: MemoryNotifier, crm: httpx.Client, kind: str
) -> None:
    armed = crm.post("/admin/failures", json={"route": "POST /quotes", "kind": kind})
    assert armed.json()["armed"] == 1

    outcome = await engine.ask("dana", QUESTION)

    # 5xx → OutcomeUnknown → reconciled by key (found; or absent and re-issued under the
    # same key), and the run went on to the send.
    assert outcome.kind is StopKind.SUSPENDED
    reconciled = [e.data for e in await engine.events(outcome.run_id) if e.kind == "reconciled"]
    assert reconciled == [
        {
            "tool_call_id": "call_2_0",
            "tool": "draft_quote",
            "found": "found" if kind == "crash_after_commit" else "absent",
        }
    ]
    quotes = crm.get("/admin/quotes", params={"account_id": "4471"}).json()["quotes"]
    assert [q["created_key"] for q in quotes] == [f"{outcome.run_id}:call_2_0"]
    draft = tool_results((await engine.get_run(outcome.run_id)).messages)["draft_quote"]
    assert draft["quote_id"] == quotes[0]["quote_id"]
    assert notifier.last().arguments == {"quote_id": quotes[0]["quote_id"]}


async def test_a_write_the_crm_refuses_reaches_the_model_as_a_tool_error(
    db_url: str, agent: Agent, crm: httpx.Client
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "draft_quote", "arguments": {**ORDER, "account_id": "5100"}}]},
        {"content": "sorry"},
    ]
    engine = Engine(agent=agent, model=ScriptedModel(turns), settings=Settings(database_url=db_url))
    try:
        outcome = await engine.ask("dana", "quote Brightwater")
        view = await engine.get_run(outcome.run_id)
    finally:
        engine.close()

    assert outcome.kind is StopKind.ANSWERED
    refusal = tool_results(view.messages)["draft_quote"]
    assert refusal["error"] == "tool_error"
    assert "forbidden" in refusal["message"]
    assert crm.get("/admin/quotes").json()["drafted"] == 0


async def test_the_scope_comes_from_the_crm_with_the_manager_as_approver(
    sandbox_server: RunningSandbox, crm: httpx.Client
) -> None:
    resolve_scope = scope_resolver(Crm(base_url=sandbox_server.url))

    dana = await resolve_scope("dana")
    stranger = await resolve_scope("nobody")

    assert dana.permissions == {
        "accounts": ["4471", "4472"],
        "can_draft_quotes": True,
        "can_send_quotes": True,
        "max_discount_pct": 10,
    }
    assert dana.approvers == frozenset({"miguel"})
    assert (await resolve_scope("miguel")).approvers == frozenset()
    assert stranger.permissions == {}
    assert not stranger.may_approve("dana")


async def test_the_tools_find_the_crm_in_their_deps_not_in_the_environment(
    sandbox_server: RunningSandbox, crm: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_SANDBOX_URL", closed_url())
    ctx = crm_context("r:c", sandbox_server.url)

    found = await find_account.call(find_account.validate({"query": "Henderson"}), ctx)

    assert found == {
        "accounts": [
            {
                "id": "4471",
                "name": "Henderson",
                "discount_tier": "silver",
                "discount_pct": 5,
                "credit_hold": False,
            }
        ]
    }


async def test_a_tool_without_its_crm_fails_before_calling_anything(crm: httpx.Client) -> None:
    ctx = ToolContext(
        run_id="r",
        user_id="dana",
        tool_call_id="c",
        idempotency_key="r:c",
        scope=Scope(user_id="dana"),
    )

    with pytest.raises(ToolFailed, match="deps"):
        await draft_quote.call(draft_quote.validate(ORDER), ctx)
    assert (await reconcile_draft("r:c", ctx)).kind is ReconcileKind.UNKNOWN
    assert counts(crm) == (0, 0)


async def test_serving_the_agent_without_a_sandbox_url_starts_one_beside_the_database(
    tmp_path: Path,
) -> None:
    agent = build_agent(Settings(database_url=f"sqlite:///{tmp_path / 'tether.db'}"))
    assert agent.deps == Crm(base_url=None)

    async with agent.running() as served:
        assert isinstance(served.deps, Crm) and served.deps.base_url is not None
        url = served.deps.base_url
        dana = await served.resolve_scope("dana")
        send = served.tool("send_quote")
        assert send is not None and send.permitted is not None
        assert not await send.permitted(send.validate({"quote_id": "Q-1"}), dana)
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/healthz")).status_code == 200

    assert dana.approvers == frozenset({"miguel"})
    assert (tmp_path / "sandbox.db").is_file()
    async with httpx.AsyncClient(base_url=url) as client:
        with pytest.raises(httpx.TransportError):
            await client.get("/healthz")


async def test_a_configured_sandbox_url_is_served_as_it_is(
    agent: Agent, sandbox_server: RunningSandbox
) -> None:
    async with agent.running() as served:
        assert served is agent
    assert agent.deps == Crm(base_url=sandbox_server.url)


async def test_an_unreachable_crm_is_a_503_that_keeps_its_address_in_the_log(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """API callers learn that the business system is unreachable; where it lives (an
    internal address) is for the operator's log only."""
    from tether.api.app import create_app

    crm_url = closed_url()
    address = crm_url.removeprefix("http://")
    agent = build_agent(Settings(sandbox_url=crm_url))
    engine = Engine(
        agent=agent, model=ScriptedModel(DEMO_TURNS), settings=Settings(database_url=db_url)
    )
    caplog.set_level(logging.WARNING, logger="tether.demo.crm")
    try:
        await engine.operator.add_user("dana", "key-dana")
        transport = httpx.ASGITransport(app=create_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as api:
            answer = await api.post(
                "/v1/runs",
                json={"question": QUESTION},
                headers={"Authorization": "Bearer key-dana"},
            )
        body = answer.json()
        assert answer.status_code == 503 and body["error"] == "sandbox_unavailable"
        assert "unreachable" in body["message"]
        assert address not in answer.text and "127.0.0.1" not in answer.text
        assert any(address in r.getMessage() + str(r.__dict__) for r in caplog.records)
        assert list(await engine.list_runs("dana")) == []  # nothing was created
    finally:
        engine.close()
