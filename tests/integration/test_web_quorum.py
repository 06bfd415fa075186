"""Who decides, in the inbox's pages (reference §19), in-process on both backends: a call
that waits on a quorum shows how many approvals it needs, who approved it so far and when,
and who may still approve it (a group as "anyone in group finance", the people who
approved left out, the owner unless the tool wants four eyes) in the inbox, on its
approval page and on the run's page; an approver who approved sees that instead of the
Approve button and may still decline; the answer says "1 of 2", a second approval by the
same person has its own page (409 ``already_decided``), and the N-th carries the call out
once. An escalated call is listed in the inbox of the people it names, marked escalated,
and they decide it there."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import deciders
import downstream
import httpx
import pytest
from inbox_web import Web, csrf_of, sign_in, words
from inbox_web import web as _web
from waiting import until

from tether import StopKind

DECISION = re.compile(r'action="(/runs/[^/]+/decision)"')
DIGEST = re.compile(r'name="digest" value="([^"]*)"')
BATCH = re.compile(r'name="((?:call|digest)\.\d)" value="([^"]*)"')
CALL = re.compile(r'name="tool_call_id" value="([^"]*)"')
APPROVE = 'name="decision" value="approve"'
DECLINE = 'name="decision" value="decline"'

Make = Callable[..., Coroutine[Any, Any, Web]]


@pytest.fixture
async def make(db_url: str) -> AsyncIterator[Make]:
    """An inbox for the deciders' agent whose model calls ``tool`` (``calls`` times in one
    turn), with ann and bob in
    the finance group, olga on call, and the lead."""
    deciders.finance()
    deciders.join("olga", "oncall")
    made: list[Web] = []

    async def making(tool: str, calls: int = 1) -> Web:
        model = deciders.script(tool, calls=calls)
        web = await _web(db_url, model=model, agent=deciders.agent())
        for person in ("ann", "bob", "olga", "lead"):
            web.keys[person] = await web.engine.operator.add_user(person)
        made.append(web)
        return web

    try:
        yield making
    finally:
        for web in made:
            web.close()


@contextlib.asynccontextmanager
async def signed_in(web: Web, person: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client signed in as ``person``."""
    async with web.client() as client:
        await sign_in(client, web.keys[person])
        yield client


async def suspended(web: Web) -> tuple[str, str]:
    """dana's run suspended on its one call, and the call's token."""
    outcome = await web.engine.ask(deciders.OWNER, "pay acct-0")
    assert outcome.kind is StopKind.SUSPENDED
    return outcome.run_id, web.notifier.last(outcome.run_id).token


async def post_decision(client: httpx.AsyncClient, path: str, decision: str) -> httpx.Response:
    """Press a button of the approval link's page (with its CSRF token)."""
    shown = await client.get(path)
    return await client.post(path, data={"csrf": csrf_of(shown.text), "decision": decision})


async def test_each_page_of_a_quorum_call_shows_its_count_its_approvers_and_who_may_still(
    make: Make,
) -> None:
    web = await make("pay")
    run_id, token = await suspended(web)
    async with signed_in(web, "boss") as boss, signed_in(web, "ann") as ann:
        first = await post_decision(boss, f"/approve/{token}", "approve")
        assert first.status_code == 200
        assert "Your approval is recorded: 1 of 2." in words(first.text)
        assert "it waits for 1 more approval from someone else" in words(first.text)
        assert downstream.effects() == []

        for path in ("/", f"/approve/{token}", f"/runs/{run_id}"):
            shown = words((await ann.get(path)).text)
            assert "2 approvals needed · 1 so far: boss at " in shown, path
            assert (
                "May still approve dana (who asked), boss" not in shown
                and "May still approve dana (who asked) or anyone in group finance" in shown
            ), path
        listed = (await ann.get("/")).text
        assert "1 of 2 approvals" in words(listed) and APPROVE in listed

        for path in ("/", f"/approve/{token}", f"/runs/{run_id}"):
            page = (await boss.get(path)).text
            shown = words(page)
            assert "You approved this; waiting for 1 more approval." in shown, path
            assert "boss (you) at " in shown, path
            assert APPROVE not in page and DECLINE in page, path  # one decline declines
        async with signed_in(web, "dana") as owner:
            mine = words((await owner.get(f"/runs/{run_id}")).text)
        assert "May still approve dana (you) or anyone in group finance" in mine

        again = await boss.post(
            f"/approve/{token}",
            data={"csrf": csrf_of((await boss.get("/")).text), "decision": "approve"},
        )
        assert again.status_code == 409
        assert "You already approved this" in words(again.text)
        assert "each person counts once" in words(again.text)

        done = await post_decision(ann, f"/approve/{token}", "approve")
        assert done.status_code == 200 and "The action was carried out." in words(done.text)
    assert [item for _, _, item in downstream.effects()] == ["acct-0:500"]


async def test_the_inbox_form_of_an_approver_who_approved_still_declines(make: Make) -> None:
    web = await make("pay")
    run_id, token = await suspended(web)
    await web.engine.resume_after_confirmation(token, "approve", "ann")
    async with signed_in(web, "ann") as ann:
        listed = await ann.get("/")
        action = DECISION.search(listed.text)
        call, digest = CALL.search(listed.text), DIGEST.search(listed.text)
        assert action and call and digest
        declined = await ann.post(
            action.group(1),
            data={
                "csrf": csrf_of(listed.text),
                "decision": "decline",
                "tool_call_id": call.group(1),
                "digest": digest.group(1),
                "reason": "not this month",
            },
        )
    assert declined.status_code == 200 and "Declined" in words(declined.text)
    assert [d["decision"] for d in await web.decisions(run_id)] == ["decline"]
    assert downstream.effects() == []


async def test_the_owner_of_a_four_eyes_call_sees_it_waiting_for_someone_else(
    make: Make,
) -> None:
    web = await make("wire")
    run_id, _ = await suspended(web)
    async with signed_in(web, "dana") as dana:
        page = (await dana.get(f"/runs/{run_id}")).text
    shown = words(page)
    assert "Waiting for someone else" in shown
    assert "2 approvals needed · 0 so far." in shown
    assert "May still approve boss or anyone in group finance (each" in shown
    assert "approve dana" not in shown and APPROVE not in page


async def test_a_decide_all_form_records_each_approval_of_its_quorum(make: Make) -> None:
    web = await make("pay", calls=2)
    outcome = await web.engine.ask(deciders.OWNER, "pay two")
    assert outcome.kind is StopKind.SUSPENDED
    run_id = outcome.run_id
    async with signed_in(web, "boss") as boss:
        page = (await boss.get(f"/runs/{run_id}")).text
        assert 'class="stack decide-all"' in page
        form = {"csrf": csrf_of(page), "all": "approve", **dict(BATCH.findall(page))}
        assert len(form) == 6  # two calls, each with its digest
        answered = await boss.post(f"/runs/{run_id}/decisions", data=form)
        assert words(answered.text).count("Your approval is recorded: 1 of 2") == 2
        again = await boss.post(f"/runs/{run_id}/decisions", data=form)
        assert words(again.text).count("You already approved it") == 2
        after = (await boss.get(f"/runs/{run_id}")).text
    assert 'class="stack decide-all"' not in after  # nothing left that boss may approve
    assert downstream.effects() == []


async def _escalated(web: Web, run_id: str) -> bool:
    await web.engine.operator.reap()
    return any(e.kind == "escalated" for e in await web.engine.events(run_id))


async def test_an_escalated_call_is_in_the_inbox_of_the_people_it_names_marked_escalated(
    make: Make,
) -> None:
    web = await make("page")
    run_id, _ = await suspended(web)
    async with signed_in(web, "olga") as olga:
        before = await olga.get("/")
        assert "Nothing is waiting for you." in words(before.text)
        assert (await olga.get(f"/runs/{run_id}")).status_code == 404

        await until(lambda: _escalated(web, run_id), what="the escalation")
        listed = await olga.get("/")
        shown = words(listed.text)
        assert f'id="run-{run_id}"' in listed.text and 'class="badge escalated"' in listed.text
        assert "Escalated at " in shown
        assert "so lead and anyone in group oncall may now decide it too." in shown
        assert (
            "May decide dana (who asked), boss, lead, anyone in group finance or anyone in "
            "group oncall"
        ) in shown
        run_page = await olga.get(f"/runs/{run_id}")
        assert run_page.status_code == 200 and APPROVE in run_page.text

        action = DECISION.search(listed.text)
        call, digest = CALL.search(listed.text), DIGEST.search(listed.text)
        assert action and call and digest
        done = await olga.post(
            action.group(1),
            data={
                "csrf": csrf_of(listed.text),
                "decision": "approve",
                "tool_call_id": call.group(1),
                "digest": digest.group(1),
            },
        )
    assert done.status_code == 200 and "The action was carried out." in words(done.text)
    assert [item for _, _, item in downstream.effects()] == ["acct-0:500"]
