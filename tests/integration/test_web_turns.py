"""A turn that waits on several calls (reference §6, one suspension per turn) in the inbox's
pages and the JSON list, in-process on both backends: the run's page shows every pending
call in call order with a form each, a decision on one is recorded and the page says how
many more the turn waits for, the last carries the turn out; the decide-all form decides
them in one post; the approval link shows its own call; ``GET /v1/approvals`` lists one
request per undecided call."""

from __future__ import annotations

import html
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import agents
import downstream
import httpx
import pytest
from inbox_web import Web, csrf_of, sign_in
from inbox_web import web as _web

from tether import StopKind
from tether.runs import RunState

CALL_IDS = re.compile(r'data-tool-call-id="([^"]+)"')
# What became of each call, in the table of a decision's result page.
ANSWERS = re.compile(r'<tr data-tool-call-id="[^"]+" data-outcome="(\w+)">')
DECISION_FORM = re.compile(r'<form method="post" action="/runs/[^/]+/decision" class="decide">')


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    w = await _web(db_url, model=agents.script("two_sends"))
    yield w
    w.engine.close()


@dataclass(frozen=True)
class Call:
    """A pending call of the turn: its id, its notice's token, its preview's digest."""

    tool_call_id: str
    token: str
    digest: str


async def two_sends(web: Web) -> tuple[str, list[Call]]:
    """dana's run suspended on its turn's two sends, and those calls, in call order."""
    outcome = await web.engine.ask("dana", "send b and c")
    assert outcome.kind is StopKind.SUSPENDED
    notices = [n for n in web.notifier.notices if n.run_id == outcome.run_id]
    assert [n.arguments for n in notices] == [{"item": "b"}, {"item": "c"}]
    pending = (await web.run(outcome.run_id)).pending_calls
    assert [p.pending.tool_call_id for p in pending] == [n.tool_call_id for n in notices]
    calls = [
        Call(tool_call_id=n.tool_call_id, token=n.token, digest=p.pending.digest or "")
        for n, p in zip(notices, pending, strict=True)
    ]
    return outcome.run_id, calls


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


def call_forms(page: str) -> list[str]:
    """The ids of the calls a page shows, in the order it shows them."""
    return CALL_IDS.findall(page)


async def decide(
    client: httpx.AsyncClient, run_id: str, notice: Call, decision: str, csrf: str
) -> httpx.Response:
    """The per-call form of the run's page, as posted by its button."""
    return await client.post(
        f"/runs/{run_id}/decision",
        data={
            "csrf": csrf,
            "decision": decision,
            "tool_call_id": notice.tool_call_id,
            "digest": notice.digest,
        },
    )


async def test_the_run_page_shows_every_call_of_the_turn_and_decides_each_with_its_own_form(
    web: Web,
) -> None:
    run_id, (b, c) = await two_sends(web)
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        page = await client.get(f"/runs/{run_id}")
        assert page.status_code == 200
        assert call_forms(page.text) == [b.tool_call_id, c.tool_call_id]
        assert len(DECISION_FORM.findall(page.text)) == 2
        assert "Action 1 of 2" in page.text and "Action 2 of 2" in page.text
        assert '<strong class="waiting-count">2</strong>' in page.text
        assert f'value="{b.digest}"' in page.text and f'value="{c.digest}"' in page.text
        assert 'action="/runs/' + run_id + '/decisions"' in page.text  # decide them all
        csrf = csrf_of(page.text)

        recorded = await decide(client, run_id, b, "approve", csrf)
        assert recorded.status_code == 200
        assert "<h1>Recorded</h1>" in recorded.text
        assert '<strong class="waiting-count">1</strong>' in recorded.text
        assert downstream.effects() == []  # nothing of the turn runs before the last decision

        page = await client.get(f"/runs/{run_id}")
        assert call_forms(page.text) == [b.tool_call_id, c.tool_call_id]
        assert len(DECISION_FORM.findall(page.text)) == 1  # the decided call has no form
        assert '<strong class="decision">approve</strong>' in page.text
        assert '<span class="by">dana</span>' in page.text
        assert '<strong class="waiting-count">1</strong>' in page.text
        assert "/decisions" not in page.text  # one call left: no decide-all form
        assert (await decide(client, run_id, b, "decline", csrf)).status_code == 409

        last = await decide(client, run_id, c, "decline", csrf)
        assert last.status_code == 200 and "<h1>Declined</h1>" in last.text
    await web.engine.run_until_stop(run_id)
    view = await web.engine.get_run(run_id)
    assert view.run.state is RunState.ANSWERED
    assert downstream.effects() == [(f"{run_id}:{b.tool_call_id}", "send", "b")]
    sent, looked, declined = tool_results(view.messages)
    assert sent["item"] == "b" and looked["query"] == "x"
    assert declined["error"] == "declined_by_user"


async def test_an_approver_sees_the_turn_on_the_run_page_after_the_first_call_is_decided(
    web: Web,
) -> None:
    run_id, (b, c) = await two_sends(web)
    await web.engine.resume_after_confirmation(b.token, "approve", "dana")
    async with web.client() as boss:
        await sign_in(boss, web.keys["boss"])
        page = await boss.get(f"/runs/{run_id}")
        assert page.status_code == 200 and "approver-view" in page.text
        assert call_forms(page.text) == [b.tool_call_id, c.tool_call_id]
        assert len(DECISION_FORM.findall(page.text)) == 1
        inbox = await boss.get("/")
        assert "1 of 2 calls wait" in inbox.text
    async with web.client() as eve:
        await sign_in(eve, web.keys["eve"])
        assert (await eve.get(f"/runs/{run_id}")).status_code == 404


async def test_the_decide_all_form_decides_every_call_in_one_post(web: Web) -> None:
    run_id, (b, c) = await two_sends(web)
    async with web.client() as client:
        await sign_in(client, web.keys["boss"])
        page = await client.get("/")
        assert "2 of 2 calls wait" in page.text
        csrf = csrf_of(page.text)
        nothing = await client.post(
            f"/runs/{run_id}/decisions",
            data={"csrf": csrf, "all": "each", "call.0": b.tool_call_id, "call.1": c.tool_call_id},
        )
        assert nothing.status_code == 422  # every call left for now: nothing decided
        assert await web.decisions(run_id) == []
        form = {
            "csrf": csrf,
            "all": "each",
            "reason": "c is <wrong>",
            "call.0": b.tool_call_id,
            "digest.0": b.digest,
            "decision.0": "approve",
            "call.1": c.tool_call_id,
            "digest.1": c.digest,
            "decision.1": "decline",
        }
        done = await client.post(f"/runs/{run_id}/decisions", data=form)
        assert done.status_code == 200 and "<h1>Decided</h1>" in done.text
        answers = ANSWERS.findall(done.text)
        assert answers == ["executed", "declined"]
        again = await client.post(f"/runs/{run_id}/decisions", data=form)
        assert again.status_code == 200
        assert ANSWERS.findall(again.text) == [
            "already_resumed",
            "already_resumed",
        ]
    await web.engine.run_until_stop(run_id)
    assert downstream.effects() == [(f"{run_id}:{b.tool_call_id}", "send", "b")]
    decisions = await web.decisions(run_id)
    assert [(d["by"], d.get("reason")) for d in decisions] == [
        ("boss", "c is <wrong>"),
        ("boss", "c is <wrong>"),
    ]
    declined = tool_results((await web.engine.get_run(run_id)).messages)[-1]
    assert declined["error"] == "declined_by_user"


async def test_approve_all_decides_every_call_and_a_stranger_decides_nothing(web: Web) -> None:
    run_id, (b, c) = await two_sends(web)
    form = {"all": "approve", "call.0": b.tool_call_id, "call.1": c.tool_call_id}
    async with web.client() as eve:
        await sign_in(eve, web.keys["eve"])
        csrf = csrf_of((await eve.get("/")).text)
        refused = await eve.post(f"/runs/{run_id}/decisions", data={**form, "csrf": csrf})
        assert refused.status_code == 404
    assert await web.decisions(run_id) == []
    async with web.client() as dana:
        await sign_in(dana, web.keys["dana"])
        csrf = csrf_of((await dana.get("/")).text)
        done = await dana.post(f"/runs/{run_id}/decisions", data={**form, "csrf": csrf})
        assert done.status_code == 200
    await web.engine.run_until_stop(run_id)
    assert sorted(item for _, _, item in downstream.effects()) == ["b", "c"]


async def test_an_approval_link_shows_its_own_call_of_the_turn(web: Web) -> None:
    run_id, (b, c) = await two_sends(web)
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        shown = await client.get(f"/approve/{c.token}")
        assert shown.status_code == 200
        assert f"<code>{html.escape(c.tool_call_id)}</code>" in shown.text
        assert f"<code>{html.escape(b.tool_call_id)}</code>" not in shown.text
        assert '<strong class="waiting-count">2</strong>' in shown.text
        decided = await client.post(
            f"/approve/{c.token}", data={"decision": "decline", "csrf": csrf_of(shown.text)}
        )
        assert decided.status_code == 200 and "<h1>Recorded</h1>" in decided.text
        first = await client.get(f"/approve/{b.token}")
        assert f"<code>{html.escape(b.tool_call_id)}</code>" in first.text
        assert "waiting-count" not in first.text  # the last call of the turn to decide
    events = await web.decisions(run_id)
    assert [e["tool_call_id"] for e in events] == [c.tool_call_id]


async def test_the_approvals_list_has_one_request_per_undecided_call(web: Web) -> None:
    run_id, (b, c) = await two_sends(web)
    async with web.client() as client:
        auth = {"Authorization": f"Bearer {web.keys['boss']}"}
        listed = (await client.get("/v1/approvals", headers=auth)).json()
        assert [(i["run_id"], i["tool_call_id"]) for i in listed["items"]] == [
            (run_id, b.tool_call_id),
            (run_id, c.tool_call_id),
        ]
        assert [i["digest"] for i in listed["items"]] == [b.digest, c.digest]
        assert [i["preview"]["item"] for i in listed["items"]] == ["b", "c"]
        assert all(
            i["decide_url"].endswith(f"/v1/runs/{run_id}/decisions") for i in listed["items"]
        )
        assert all(i["pending_calls"] == 2 and i["may_decide"] for i in listed["items"])
        await web.engine.resume_after_confirmation(b.token, "approve", "dana")
        listed = (await client.get("/v1/approvals", headers=auth)).json()
        assert [i["tool_call_id"] for i in listed["items"]] == [c.tool_call_id]


async def test_the_second_call_is_edited_from_the_run_page_and_approved_as_edited(
    web: Web,
) -> None:
    run_id, (b, c) = await two_sends(web)
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = csrf_of((await client.get(f"/runs/{run_id}")).text)
        call = {"tool_call_id": c.tool_call_id, "digest": c.digest, "csrf": csrf}
        shown = await client.post(f"/runs/{run_id}/preview", data={**call, "arg.item": "d"})
        assert shown.status_code == 200 and "Approve the edited action?" in shown.text
        assert '<td class="after">d</td>' in shown.text
        digest = re.search(r'name="approved_digest" value="([0-9a-f]{64})"', shown.text)
        arguments = re.search(r'name="arguments" value="([^"]+)"', shown.text)
        assert digest and arguments
        approved = await client.post(
            f"/runs/{run_id}/decision",
            data={
                **call,
                "decision": "approve",
                "arguments": html.unescape(arguments.group(1)),
                "approved_digest": digest.group(1),
            },
        )
        assert approved.status_code == 200 and "<h1>Recorded</h1>" in approved.text
        last = await decide(client, run_id, b, "approve", csrf)
        assert last.status_code == 200 and "<h1>Approved</h1>" in last.text
    await web.engine.run_until_stop(run_id)
    assert [item for _, _, item in downstream.effects()] == ["b", "d"]
