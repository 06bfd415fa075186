"""One bounded JSON reader for the JSON API and the inbox's forms, on both backends: a value
nested deeper than ``MAX_JSON_DEPTH`` is a clear 4xx wherever it is posted (an edit
form's JSON field, the hidden edited arguments of an approval form, a request body), and
nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import agents
import downstream
import pytest
from inbox_web import Web, session_csrf, sign_in, web

from tether import Agent, ScriptedModel
from tether.inputs import MAX_JSON_DEPTH
from tether.runs import RunState

ORDER = {"sku": "A-1", "quantity": 3}
# Deeper than the standard parser's recursion limit (a RecursionError, a 500, before).
TOO_DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture
async def shipping(db_url: str) -> AsyncIterator[Web]:
    """The inbox of an agent whose confirmed ``ship`` takes a list (a JSON field)."""
    agent = Agent(
        name="shipping", system_prompt="Ship.", tools=(agents.ship,), resolve_scope=agents.resolve
    )
    model = ScriptedModel(
        [{"tool_calls": [{"name": "ship", "arguments": ORDER}]}, {"content": "shipped"}]
    )
    w = await web(db_url, model=model, agent=agent)
    yield w
    w.close()


async def test_an_over_deep_json_field_of_the_edit_form_is_refused_and_changes_nothing(
    shipping: Web,
) -> None:
    run_id, token = await shipping.suspended()
    before = await shipping.run(run_id)
    assert before.pending is not None
    call = {"tool_call_id": before.pending.tool_call_id, "digest": before.pending.digest or ""}
    edit = {"arg.sku": "A-1", "arg.quantity": "3", "arg.labels": TOO_DEEP}
    async with shipping.client() as client:
        await sign_in(client, shipping.keys["dana"])
        csrf = await session_csrf(client)
        by_link = await client.post(f"/approve/{token}/preview", data={**edit, "csrf": csrf})
        by_run = await client.post(f"/runs/{run_id}/preview", data={**edit, **call, "csrf": csrf})
        # An over-deep number field is only text, which validation then refuses.
        number = await client.post(
            f"/approve/{token}/preview",
            data={**edit, "arg.labels": "", "arg.quantity": TOO_DEEP, "csrf": csrf},
        )
    for refused in (by_link, by_run):
        assert refused.status_code == 422 and "Your edits were not accepted" in refused.text
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in refused.text
    assert number.status_code == 422 and "quantity" in number.text
    after = await shipping.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
    assert "approved" not in [e.kind for e in await shipping.engine.events(run_id)]


async def test_over_deep_edited_arguments_of_an_approval_form_are_refused(shipping: Web) -> None:
    run_id, token = await shipping.suspended()
    before = await shipping.run(run_id)
    assert before.pending is not None
    deep = '{"sku": "A-1", "quantity": 3, "labels": ' + TOO_DEEP + "}"
    call = {"tool_call_id": before.pending.tool_call_id, "digest": before.pending.digest or ""}
    async with shipping.client() as client:
        await sign_in(client, shipping.keys["dana"])
        csrf = await session_csrf(client)
        decision = {"decision": "approve", "arguments": deep, "csrf": csrf}
        by_link = await client.post(f"/approve/{token}", data=decision)
        by_run = await client.post(f"/runs/{run_id}/decision", data={**decision, **call})
    for refused in (by_link, by_run):
        assert refused.status_code == 422
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in refused.text
    after = await shipping.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
    assert downstream.effects() == []
    approved = await shipping.engine.resume_after_confirmation(token, "approve", "dana")
    assert approved.ok  # the token survived the refusals


async def test_the_json_api_refuses_an_over_deep_body_as_invalid_input(shipping: Web) -> None:
    run_id, token = await shipping.suspended()
    before = await shipping.run(run_id)
    auth = {"Authorization": f"Bearer {shipping.keys['dana']}"}
    deep = '{"sku": "A-1", "quantity": 3, "labels": ' + TOO_DEEP + "}"
    # Just over the bound: the parser could read it, the bound refuses it all the same.
    over = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    async with shipping.client() as client:
        answers = [
            await client.post(
                f"/v1/approvals/{token}",
                content='{"decision": "approve", "arguments": ' + deep + "}",
                headers={**auth, "Content-Type": "application/json"},
            ),
            await client.post(
                f"/v1/approvals/{token}/preview",
                content='{"arguments": {"sku": "A-1", "quantity": 3, "labels": ' + over + "}}",
                headers={**auth, "Content-Type": "application/json"},
            ),
            await client.post("/v1/runs", content='{"question": ' + TOO_DEEP + "}", headers=auth),
        ]
    for answer in answers:
        assert answer.status_code == 422
        body = answer.json()
        assert body["ok"] is False and body["error"] == "invalid_input"
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in body["message"]
    after = await shipping.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
    assert [r.id for r in await shipping.engine.list_runs("dana")] == [run_id]
