"""A run's thread in the inbox (reference §14), in-process on both backends: the run's page
lists its thread's runs in order, the current one marked and the others linked; an
answered run that is the latest of an idle thread offers a follow-up box, which starts a
run in the same thread as the session's user, only with the session's CSRF token and only
on their own run; a busy thread refuses it (naming the run it waits on) unless it is to be
queued, and a refused question changes nothing.

No worker runs here: runs are carried with ``engine.run_until_stop``.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import agents
import httpx
import pytest
from inbox_web import Web, csrf_of, session_csrf, sign_in, web

from tether import StopKind
from tether.runs import RunState

FOLLOW_UP_FORM = re.compile(r'<form method="post" action="/runs/([0-9a-f]+)/follow-up"')
THREAD_RUN = re.compile(r'<li id="thread-run-([0-9a-f]+)"( class="current" aria-current="page")?')
RUN_LINK = re.compile(r'<tr id="run-([0-9a-f]+)"')


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Web]:
    """Each run plays the script its thread's first question names (``script:NAME``); a
    follow-up of ``script:answer`` answers with the script's final message."""
    w = await web(db_url, model=agents.ByQuestion())
    yield w
    w.close()


async def answered(app: Web, user: str = "dana") -> str:
    outcome = await app.engine.ask(user, "script:answer what is it?")
    assert outcome.kind is StopKind.ANSWERED
    return outcome.run_id


def thread_rows(page: str) -> list[tuple[str, bool]]:
    """The runs the page's thread lists, in order, and which one is marked current."""
    return [(run_id, bool(current)) for run_id, current in THREAD_RUN.findall(page)]


async def all_runs(app: Web) -> list[str]:
    return [run.id for run in await app.engine.list_runs(None)]


async def test_the_run_page_lists_its_thread_and_only_the_latest_answered_run_offers_a_follow_up(
    app: Web,
) -> None:
    first = await answered(app)
    thread = (await app.run(first)).thread_id
    second = await app.engine.start_run("dana", "and then?", thread_id=thread)
    third = await app.engine.start_run(
        "dana", "and <b>after</b>?", thread_id=thread, if_busy="enqueue"
    )
    assert third.state is RunState.QUEUED
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        pages = {
            run_id: (await client.get(f"/runs/{run_id}")).text
            for run_id in (first, second.id, third.id)
        }
        queued = await client.get("/runs", params={"state": "queued"})
        for run_id in (second.id, third.id):
            assert (await app.engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
        after = {run_id: (await client.get(f"/runs/{run_id}")).text for run_id in (first, third.id)}
    order = [first, second.id, third.id]
    for run_id, shown in pages.items():
        assert thread_rows(shown) == [(r, r == run_id) for r in order]
        others = [r for r in order if r != run_id]
        assert all(f'<a href="/runs/{r}">' in shown for r in others)
        assert f'<a href="/runs/{run_id}">' not in shown  # the current run is marked, not linked
        assert f'<code class="thread-id">{thread}</code>' in shown
        assert FOLLOW_UP_FORM.search(shown) is None  # busy: no run of it offers a follow-up
    shown = re.sub(r"\s+", " ", pages[first])
    assert 'state-answered">answered</span>' in shown and 'state-running">running</span>' in shown
    assert 'state-queued">queued</span>' in shown
    assert "and &lt;b&gt;after&lt;/b&gt;?" in shown and "<b>after" not in shown  # escaped
    assert '<option value="queued" selected>' in queued.text
    assert RUN_LINK.findall(queued.text) == [third.id]
    assert FOLLOW_UP_FORM.findall(after[third.id]) == [third.id]  # the latest, answered, idle
    assert FOLLOW_UP_FORM.search(after[first]) is None  # answered, but not the latest


async def test_a_follow_up_from_the_box_starts_a_run_in_the_same_thread_and_shows_its_page(
    app: Web,
) -> None:
    first = await answered(app)
    thread = (await app.run(first)).thread_id
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        shown = await client.get(f"/runs/{first}")
        assert FOLLOW_UP_FORM.findall(shown.text) == [first]
        sent = await client.post(
            f"/runs/{first}/follow-up",
            data={"csrf": csrf_of(shown.text), "question": "  and then?\r\nTell me.  "},
        )
        assert sent.status_code == 303
        new_id = sent.headers["location"].removeprefix("/runs/")
        new = await app.run(new_id)
        landed = await client.get(sent.headers["location"])
        assert (await app.engine.run_until_stop(new_id)).kind is StopKind.ANSWERED
        done = await client.get(sent.headers["location"])
    assert new.thread_id == thread and new.user_id == "dana" and new.thread_pos == 2
    assert new.question == "and then?\nTell me." and new.state is RunState.RUNNING
    assert thread_rows(landed.text) == [(first, False), (new_id, True)]
    assert f'<a href="/runs/{first}">' in landed.text
    assert FOLLOW_UP_FORM.search(landed.text) is None  # not answered yet
    conversation = (await app.engine.get_thread(thread, user="dana")).messages or []
    questions = [m["content"] for m in conversation if m["role"] == "user"]
    assert questions == ["script:answer what is it?", "and then?\nTell me."]
    assert "I have nothing more to do." in html.unescape(done.text)  # the follow-up's answer
    assert FOLLOW_UP_FORM.findall(done.text) == [new_id]


async def _refused_posts(client: httpx.AsyncClient, run_id: str, csrf: str) -> list[int]:
    statuses = []
    for data, headers in (
        ({"question": "q"}, {}),
        ({"question": "q", "csrf": "0" * 64}, {}),
        ({"question": "q", "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
    ):
        refused = await client.post(f"/runs/{run_id}/follow-up", data=data, headers=headers)
        assert "Nothing was done" in refused.text
        statuses.append(refused.status_code)
    return statuses


async def test_a_follow_up_without_the_sessions_csrf_token_or_from_another_user_creates_nothing(
    app: Web,
) -> None:
    first = await answered(app)
    waiting, _ = await app.suspended("script:send b")
    before = await all_runs(app)
    async with app.client() as other:
        await sign_in(other, app.keys["dana"])
        stolen = await session_csrf(other)
    async with app.client() as client:
        anonymous = await client.post(
            f"/runs/{first}/follow-up", data={"csrf": stolen, "question": "q"}
        )
        await sign_in(client, app.keys["dana"])
        statuses = await _refused_posts(client, first, await session_csrf(client))
        with_another_sessions = await client.post(
            f"/runs/{first}/follow-up", data={"csrf": stolen, "question": "q"}
        )
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == f"/login?next=/runs/{first}"
    assert statuses == [403, 403, 403] and with_another_sessions.status_code == 403
    for user in ("eve", "boss"):  # boss may approve dana's requests, not ask in her threads
        async with app.client() as client:
            await sign_in(client, app.keys[user])
            csrf = await session_csrf(client)
            approver_view = await client.get(f"/runs/{waiting}")
            for run_id in (first, waiting):
                refused = await client.post(
                    f"/runs/{run_id}/follow-up", data={"csrf": csrf, "question": "q"}
                )
                assert refused.status_code == 404 and "There is no such run" in refused.text
                assert "dana" not in refused.text
        if user == "boss":
            assert approver_view.status_code == 200 and "approver-view" in approver_view.text
            assert "follow-up" not in approver_view.text and "thread-runs" not in approver_view.text
    assert await all_runs(app) == before


async def test_a_busy_thread_refuses_the_follow_up_naming_the_run_it_waits_on_unless_it_is_queued(
    app: Web,
) -> None:
    first = await answered(app)
    thread = (await app.run(first)).thread_id
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        csrf = await session_csrf(client)
        shown = await client.get(f"/runs/{first}")
        assert FOLLOW_UP_FORM.findall(shown.text) == [first]
        # Meanwhile the thread goes on elsewhere (the API, another tab).
        going = await app.engine.start_run("dana", "from elsewhere", thread_id=thread)
        before = await all_runs(app)
        busy = await client.post(
            f"/runs/{first}/follow-up", data={"csrf": csrf, "question": "mine <i>too</i>"}
        )
        assert await all_runs(app) == before
        queued = await client.post(
            f"/runs/{first}/follow-up",
            data={"csrf": csrf, "question": "mine too", "if_busy": "enqueue"},
        )
    assert busy.status_code == 409
    text = re.sub(r"\s+", " ", html.unescape(busy.text))
    assert "Not sent: a run of this thread is still going." in text
    assert f'It waits on run <a href="/runs/{going.id}">' in text
    assert ">mine &lt;i&gt;too&lt;/i&gt;</textarea>" in busy.text  # what was typed, escaped
    assert FOLLOW_UP_FORM.findall(busy.text) == [first]  # the box again, to queue it
    assert queued.status_code == 303
    new = await app.run(queued.headers["location"].removeprefix("/runs/"))
    assert new.state is RunState.QUEUED and new.thread_id == thread and new.question == "mine too"
    thread_runs = (await app.engine.get_thread(thread, user="dana")).runs
    assert [r.id for r in thread_runs] == [first, going.id, new.id]


async def test_a_blank_or_malformed_question_is_refused_with_why_and_creates_nothing(
    app: Web,
) -> None:
    first = await answered(app)
    before = await all_runs(app)
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        csrf = await session_csrf(client)
        blank = await client.post(
            f"/runs/{first}/follow-up", data={"csrf": csrf, "question": " \r\n "}
        )
        missing = await client.post(f"/runs/{first}/follow-up", data={"csrf": csrf})
        nul = await client.post(
            f"/runs/{first}/follow-up", data={"csrf": csrf, "question": "a\x00b"}
        )
    for refused in (blank, missing):
        assert refused.status_code == 422 and "Not sent: question must" in refused.text
        assert FOLLOW_UP_FORM.findall(refused.text) == [first]
    # A NUL anywhere in a form is refused by the inbox's one form reader, before any route.
    assert nul.status_code == 422 and "question must not contain NUL" in nul.text
    assert await all_runs(app) == before
