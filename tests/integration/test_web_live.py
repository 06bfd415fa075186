"""The inbox follows runs live (reference §16), on both backends: a run's page has its
owner's stream of the run (the model's text as it is written, and the stored events)
through the session's cookie, the lists have a signal for the viewer's runs they show, and
the pages carry the hooks of their one script, allowed by a policy of our own scripts only.

The streams are read from a real uvicorn (``served.serving``); the pages and refusals
in-process (``inbox_web``)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import agents
import httpx
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse
from inbox_web import Web, sign_in, web
from served import DEADLINE_S, KEYS, serving
from waiting import until

from tether import Engine, StopKind
from tether.runs import RunState

TEXT = agents.SCRIPTS["streamed_send"][0]["content"]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)")


def watched(engine: Engine) -> bool:
    """Whether a watcher of this process subscribed to deltas."""
    hub = engine.runner.services.deltas
    assert hub is not None
    return any(run.watchers for run in hub._runs.values())


def name(item: ServerSentEvent) -> str:
    """A stream item's name: its ``event:``, or for a stored event (sent unnamed to the
    inbox, a ``message``) its kind."""
    return str(json.loads(item.data)["kind"]) if item.event == "message" else item.event


async def read_until(
    events: AsyncIterator[ServerSentEvent], last: str, kind: str | None = None
) -> list[ServerSentEvent]:
    """The stream's events up to the first named ``last`` (whose data's ``kind`` is
    ``kind``, if given), included."""
    seen: list[ServerSentEvent] = []
    async with asyncio.timeout(DEADLINE_S):
        async for item in events:
            seen.append(item)
            if name(item) == last and (kind is None or json.loads(item.data)["kind"] == kind):
                return seen
    raise AssertionError(f"the stream ended before {last}: {[name(e) for e in seen]}")


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Web]:
    w = await web(db_url, model=agents.ByQuestion())
    yield w
    w.close()


async def test_the_run_s_live_route_streams_its_text_and_events_to_the_owner_s_session(
    db_url: str,
) -> None:
    async with (
        serving(db_url, script_name="streamed_send") as served,
        httpx.AsyncClient(base_url=served.base, timeout=DEADLINE_S) as client,
    ):
        await sign_in(client, KEYS["dana"])
        run = await served.engine.start_run("dana", "send it")
        async with aconnect_sse(client, "GET", f"/runs/{run.id}/live") as source:
            assert source.response.status_code == 200
            await until(lambda: watched(served.engine), what="the page's stream to subscribe")
            carried = asyncio.create_task(served.engine.run_until_stop(run.id))
            seen = await read_until(source.aiter_sse(), "suspended")
        assert (await carried).kind is StopKind.SUSPENDED
    deltas = [json.loads(e.data) for e in seen if e.event == "delta"]
    assert len(deltas) > 2 and all(d["step"] == 1 for d in deltas)  # many pieces, not one
    written = ""
    for delta in deltas:
        assert delta["offset"] == len(written)
        written += delta["text"]
    assert written == TEXT
    stored = [e for e in seen if e.event != "delta"]
    assert [e.id for e in stored] == [str(n) for n in range(1, len(stored) + 1)]
    assert {e.event for e in stored} == {"message"}  # unnamed: the script takes every kind
    [turn] = [json.loads(e.data) for e in stored if name(e) == "model_turn"]
    assert turn["data"]["text"] == TEXT
    assert name(stored[-1]) == "suspended"


async def test_the_live_route_is_the_owner_s_alone_and_asks_a_visitor_to_sign_in(
    app: Web,
) -> None:
    run_id, _ = await app.suspended("script:send b")
    async with app.client() as client:
        unsigned = await client.get(f"/runs/{run_id}/live")
        assert unsigned.status_code == 303
        assert unsigned.headers["location"] == f"/login?next=/runs/{run_id}"
        assert (await client.get(f"/live?run={run_id}")).status_code == 303
        await sign_in(client, app.keys["eve"])
        stranger = await client.get(f"/runs/{run_id}/live")
        missing = await client.get("/runs/0123456789abcdef0123456789abcdef/live")
    async with app.client() as client:
        await sign_in(client, app.keys["boss"])
        approver_page = await client.get(f"/runs/{run_id}")
        approver_stream = await client.get(f"/runs/{run_id}/live")
    for refused in (stranger, missing, approver_stream):
        assert refused.status_code == 404 and "There is no such run." in refused.text
    # The approver reads the request's page (read-only), but the run's stream is its owner's.
    assert approver_page.status_code == 200 and "data-live-stream" not in approver_page.text


async def test_a_list_s_signal_names_each_new_event_of_the_viewer_s_runs_then_ends(
    db_url: str,
) -> None:
    async with (
        serving(db_url, script_name="streamed_send") as served,
        httpx.AsyncClient(base_url=served.base, timeout=DEADLINE_S) as client,
    ):
        await sign_in(client, KEYS["dana"])
        run = await served.engine.start_run("dana", "send it")
        theirs = await served.engine.start_run("miguel", "send it")
        named = {"run": [run.id, theirs.id, "not-a-run"]}
        async with aconnect_sse(client, "GET", "/live", params=named) as source:
            assert source.response.status_code == 200
            events = source.aiter_sse()
            outcome = await served.engine.run_until_stop(run.id)
            assert outcome.kind is StopKind.SUSPENDED
            seen = await read_until(events, "changed", kind="suspended")
            await served.engine.cancel_run(run.id, "dana")
            seen += await read_until(events, "done")
    signals = [json.loads(e.data) for e in seen if e.event == "changed"]
    assert {s["run_id"] for s in signals} == {run.id}  # only dana's own run
    kinds = [s["kind"] for s in signals]
    assert "created" not in kinds  # from the stream's start on, nothing again
    assert kinds[-1] == "cancelled" and "suspended" in kinds
    assert seen[-1].event == "done"


async def test_pages_carry_the_live_hooks_and_allow_only_their_own_scripts(app: Web) -> None:
    run_id, _ = await app.suspended("script:send b")
    answered = (await app.engine.ask("dana", "script:answer hi")).run_id
    shown = len(await app.engine.events(run_id))
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        paths = (f"/runs/{run_id}", f"/runs/{answered}", "/runs", "/")
        pages = {path: await client.get(path) for path in paths}
        script = await client.get("/static/live.js")
    for path, page in pages.items():
        assert page.status_code == 200, path
        policy = page.headers["content-security-policy"]
        assert "script-src 'self';" in policy and "connect-src 'self';" in policy
        assert "default-src 'none'" in policy and "unsafe" not in policy
        assert '<script src="/static/live.js" defer></script>' in page.text, path
        assert not INLINE_SCRIPT.search(page.text), path
    running = pages[f"/runs/{run_id}"].text
    assert f'data-live-stream="/runs/{run_id}/live?after={shown}"' in running
    for part in ("run", "pending", "actions", "timeline", "messages"):
        assert f'data-live="{part}"' in running
    assert "data-live-text" in running and 'class="decide"' in running
    assert "data-live-stream" not in pages[f"/runs/{answered}"].text  # terminal: nothing to follow
    runs = pages["/runs"].text
    assert f'data-live-run="{run_id}"' in runs and f'data-live-run="{answered}"' not in runs
    assert 'data-live-list="/live"' in runs and 'data-live-page="/runs"' in runs
    assert f'data-live-run="{run_id}"' in pages["/"].text
    assert script.status_code == 200 and "EventSource" in script.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert (await app.run(run_id)).state is RunState.SUSPENDED
