"""The inbox's runs page and a run's Continue and Cancel forms, in-process on both backends:
a viewer lists only their own runs, newest first, filtered by a validated state and a
page at a time; only the run's owner continues (with the default grant its page showed,
and the reason as its ``why``) or cancels, only with the session's CSRF token; and an
approver opens the run behind a request they may decide, read-only, exactly while they
may decide it."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import agents
import downstream
import httpx
import pytest
from inbox_web import Web, csrf_of, session_csrf, sign_in, web

import tether.api.web.runs
from tether.runs import RunState

RUN_LINK = re.compile(r'<tr id="run-([0-9a-f]+)"')


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Web]:
    """Each run plays the script its question names (``script:NAME``)."""
    w = await web(db_url, model=agents.ByQuestion())
    yield w
    w.close()


async def halted(app: Web, user: str = "dana") -> str:
    """A run of ``user`` halted by its step budget after its first step."""
    outcome = await app.engine.ask(user, "script:work go", limits={"max_steps": 1})
    run = await app.run(outcome.run_id)
    assert run.state is RunState.HALTED
    return run.id


def listed(page: str) -> list[str]:
    return RUN_LINK.findall(page)


async def test_the_runs_page_lists_the_viewers_own_runs_newest_first_by_state(app: Web) -> None:
    answered = (await app.engine.ask("dana", "script:answer <b>hi</b>")).run_id
    suspended, _ = await app.suspended("script:send b")
    stopped = await halted(app)
    others = (await app.engine.ask("boss", "script:answer hi")).run_id
    newest_first = [run.id for run in await app.engine.list_runs("dana")]
    assert sorted(newest_first) == sorted([answered, suspended, stopped])
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        inbox = await client.get("/")
        every = await client.get("/runs")
        only_halted = await client.get("/runs", params={"state": "halted"})
        none_failed = await client.get("/runs", params={"state": "failed"})
    assert 'href="/runs"' in inbox.text  # the inbox's navigation links it
    assert every.status_code == 200 and listed(every.text) == newest_first
    assert others not in every.text and "more" not in every.text
    assert "&lt;b&gt;hi&lt;/b&gt;" in every.text and "<b>hi" not in every.text  # escaped
    assert listed(only_halted.text) == [stopped] and "max_steps" in only_halted.text
    assert '<option value="halted" selected>' in only_halted.text
    assert listed(none_failed.text) == [] and "No runs failed" in none_failed.text


async def test_a_bad_state_or_page_is_a_clear_refusal_and_not_an_error(app: Web) -> None:
    async with app.client() as client:
        anonymous = await client.get("/runs", params={"state": "halted"})
        await sign_in(client, app.keys["dana"])
        bad_state = await client.get("/runs", params={"state": "<b>paused</b>"})
        bad_cursor = await client.get("/runs", params={"after": "no-such-run"})
        malformed = await client.get("/runs", params={"after": "../x"})
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == "/login?next=/runs%3Fstate%3Dhalted"
    assert bad_state.status_code == 422 and "state must be one of" in bad_state.text
    assert "running, suspended, waiting, halted" in bad_state.text
    assert "<b>paused" not in bad_state.text
    assert bad_cursor.status_code == 422 and "one of the user" in html.unescape(bad_cursor.text)
    assert malformed.status_code == 422 and "no such page" in malformed.text


async def test_the_runs_page_says_how_many_more_and_links_the_next_page(
    app: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tether.api.web.runs, "PAGE_SIZE", 2)
    for n in range(5):
        await app.engine.start_run("dana", f"question {n}")
    await halted(app)  # another state: never on the pages of running runs
    newest_first = [r.id for r in await app.engine.list_runs("dana") if r.state.value == "running"]
    pages, more = [], []
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        url: str | None = "/runs?state=running"
        while url is not None:
            shown = await client.get(url)
            assert shown.status_code == 200
            pages.append(listed(shown.text))
            found = re.search(
                r'(\d+) more runs? running\.\s*<a href="([^"]+)">Next page', shown.text
            )
            more.append(int(found.group(1)) if found else 0)
            url = html.unescape(found.group(2)) if found else None
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]
    assert more == [3, 1, 0]


async def test_continue_applies_the_grant_the_page_showed_and_records_the_reason(
    app: Web,
) -> None:
    run_id = await halted(app)
    before = await app.run(run_id)
    granted = before.limits.extended()
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        shown = await client.get(f"/runs/{run_id}")
        assert shown.status_code == 200 and 'action="/runs/' + run_id + '/continue"' in shown.text
        grant = re.sub(r"\s+", " ", shown.text)
        assert (
            f'<th scope="row">steps</th><td>1</td><td class="granted">{granted.max_steps}</td>'
            in grant
        )
        assert f'<td class="granted">{granted.max_spend_usd:.4f}</td>' in grant
        assert f'<td class="granted">{granted.max_tool_calls}</td>' in grant
        assert f'<td class="granted">{granted.max_elapsed_ms}</td>' in grant
        continued = await client.post(
            f"/runs/{run_id}/continue",
            data={"csrf": csrf_of(shown.text), "reason": "one more go, <please>"},
        )
        again = await client.post(f"/runs/{run_id}/continue", data={"csrf": csrf_of(shown.text)})
    assert continued.status_code == 303 and continued.headers["location"] == f"/runs/{run_id}"
    after = await app.run(run_id)
    assert after.state is RunState.RUNNING and after.limits == granted
    [event] = [e.data for e in await app.engine.events(run_id) if e.kind == "continued"]
    assert event["by"] == "dana" and event["why"] == "one more go, <please>"
    assert event["new_limits"] == granted.to_json()
    assert again.status_code == 409 and "Not continued" in again.text
    assert "not halted" in again.text and "Cancel the run" in again.text


async def test_cancel_ends_a_run_that_is_not_terminal_and_its_request(app: Web) -> None:
    run_id, token = await app.suspended("script:send b")
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        shown = await client.get(f"/runs/{run_id}")
        assert 'action="/runs/' + run_id + '/cancel"' in shown.text
        assert "/continue" not in shown.text  # only a halted run is continued
        cancelled = await client.post(f"/runs/{run_id}/cancel", data={"csrf": csrf_of(shown.text)})
        again = await client.post(f"/runs/{run_id}/cancel", data={"csrf": csrf_of(shown.text)})
        finished = await client.get(f"/runs/{run_id}")
    assert cancelled.status_code == 303
    assert (await app.run(run_id)).state is RunState.CANCELLED
    assert again.status_code == 409 and "Not cancelled" in again.text
    assert "/cancel" not in finished.text and "/continue" not in finished.text
    with pytest.raises(Exception, match="unknown or has expired"):
        await app.engine.resume_after_confirmation(token, "approve", "dana")
    assert downstream.effects() == []


async def _acting_posts(client: httpx.AsyncClient, run_id: str, csrf: str) -> list[int]:
    statuses = []
    for action in ("continue", "cancel"):
        for data, headers in (
            ({}, {}),
            ({"csrf": "0" * 64}, {}),
            ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
        ):
            refused = await client.post(f"/runs/{run_id}/{action}", data=data, headers=headers)
            assert "Nothing was done" in refused.text
            statuses.append(refused.status_code)
    return statuses


async def test_continue_and_cancel_need_the_sessions_csrf_token_and_change_nothing(
    app: Web,
) -> None:
    run_id = await halted(app)
    before = await app.run(run_id)
    events = await app.kinds(run_id)
    async with app.client() as other:
        await sign_in(other, app.keys["dana"])
        stolen = await session_csrf(other)
    async with app.client() as client:
        anonymous = [
            await client.post(f"/runs/{run_id}/{action}", data={"csrf": stolen})
            for action in ("continue", "cancel")
        ]
        await sign_in(client, app.keys["dana"])
        statuses = await _acting_posts(client, run_id, await session_csrf(client))
        with_another_sessions = await client.post(f"/runs/{run_id}/cancel", data={"csrf": stolen})
    assert [r.status_code for r in anonymous] == [303, 303]
    assert statuses == [403] * 6 and with_another_sessions.status_code == 403
    after = await app.run(run_id)
    assert after.state is RunState.HALTED and after.updated_at == before.updated_at
    assert await app.kinds(run_id) == events


async def test_only_the_owner_may_continue_or_cancel_and_others_learn_nothing(app: Web) -> None:
    stopped = await halted(app)
    waiting, _ = await app.suspended("script:send b")
    before = {run_id: await app.run(run_id) for run_id in (stopped, waiting)}
    for user in ("eve", "boss"):  # boss may approve dana's requests, not act on her runs
        async with app.client() as client:
            await sign_in(client, app.keys[user])
            csrf = await session_csrf(client)
            for run_id in (stopped, waiting):
                for action in ("continue", "cancel"):
                    refused = await client.post(f"/runs/{run_id}/{action}", data={"csrf": csrf})
                    assert refused.status_code == 404 and "There is no such run" in refused.text
                    assert "dana" not in refused.text
            missing = await client.post("/runs/no-such-run/cancel", data={"csrf": csrf})
            assert missing.status_code == 404 and missing.text == refused.text
    for run_id, run in before.items():
        after = await app.run(run_id)
        assert after.state is run.state and after.updated_at == run.updated_at


async def test_an_approver_opens_the_run_behind_a_request_exactly_while_they_may_decide_it(
    app: Web,
) -> None:
    run_id, token = await app.suspended("script:send b")
    stopped = await halted(app)
    async with app.client() as client:
        await sign_in(client, app.keys["boss"])
        inbox = await client.get("/")
        shown = await client.get(f"/runs/{run_id}")
        missing = await client.get("/runs/no-such-run")
        not_waiting = await client.get(f"/runs/{stopped}")
        assert f'<a href="/runs/{run_id}">Open the run</a>' in inbox.text
        assert shown.status_code == 200
        assert "script:send b" in shown.text and "role-user" in shown.text  # the conversation
        assert (
            "<code>send</code>" in shown.text and f'action="/runs/{run_id}/decision"' in shown.text
        )
        assert "approver-view" in shown.text and "Only dana can" in shown.text
        for absent in ("/continue", "/cancel", "/fork", "Timeline", "Budget"):
            assert absent not in shown.text
        assert missing.status_code == not_waiting.status_code == 404
        assert not_waiting.text == missing.text  # a run they may not see is a missing run
        await app.engine.resume_after_confirmation(token, "approve", "boss")
        decided = await client.get(f"/runs/{run_id}")
        assert decided.status_code == 404 and decided.text == missing.text
    async with app.client() as client:
        other_run, _ = await app.suspended("script:send b")
        await sign_in(client, app.keys["eve"])
        stranger = await client.get(f"/runs/{other_run}")
        missing_for_eve = await client.get("/runs/no-such-run")
    assert stranger.status_code == 404 and stranger.text == missing_for_eve.text
    assert "dana" not in stranger.text


async def test_the_runs_pages_say_why_a_queued_run_waits(app: Web) -> None:
    later = datetime.now(UTC) + timedelta(hours=3)
    await app.engine.operator.set_user("dana", max_priority=4)
    timed = await app.engine.start_run("dana", "script:answer hi", start_at=later, priority=4)
    first, _ = await app.suspended("script:send b")
    behind = await app.engine.start_run(
        "dana", "script:answer hi", thread_id=(await app.run(first)).thread_id, if_busy="enqueue"
    )
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        queued = await client.get("/runs", params={"state": "queued"})
        page = await client.get(f"/runs/{timed.id}")
    assert sorted(listed(queued.text)) == sorted([timed.id, behind.id])
    rows = {
        run_id: queued.text.split(f'id="run-{run_id}"')[1].split("</tr>")[0]
        for run_id in (timed.id, behind.id)
    }
    starts = f"starts at {later.strftime('%Y-%m-%d %H:%M:%S')} UTC"
    assert starts in rows[timed.id] and "priority 4" in rows[timed.id]
    assert "after the runs before it in its thread have stopped" in rows[behind.id]
    assert "starts at" not in rows[behind.id]
    assert starts in page.text and "priority 4" in page.text
    assert "Started" not in page.text  # it has not: it is queued
