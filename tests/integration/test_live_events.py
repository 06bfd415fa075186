"""Live events (reference §11): ``GET /v1/runs/{id}/events/stream`` served by a real uvicorn on a
loopback port, read by a real SSE client, and ``engine.watch``, on both backends.

A client that disconnects mid-run and reconnects with ``Last-Event-ID`` gets every event
exactly once, in order; the stream closes after a terminal state and stays open (with
keep-alive comments) while the run waits; on PostgreSQL a watcher is woken by the
notices of every kind of writer (a step, an approval's claim, a cancel) with the poll
set far beyond the test's deadline.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import inprocess
import processes
import pytest
from httpx_sse import aconnect_sse
from served import DANA, DEADLINE_S, KEYS, serving
from waiting import until

from tether import Engine, StopKind
from tether.errors import InvalidInput, NotFound
from tether.results import LiveEvent

# Far beyond every deadline below: a watcher that wakes in time was woken by a notice.
NO_POLL_S = 600.0


async def _approve(engine: Engine) -> None:
    token = engine.runner.services.notifier.last().token  # type: ignore[attr-defined]
    result = await engine.resume_after_confirmation(token, "approve", "dana")
    assert result.ok, result


async def _drive_to_the_end(engine: Engine, run_id: str) -> None:
    assert (await engine.run_until_stop(run_id)).kind is StopKind.SUSPENDED
    await _approve(engine)
    assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED


async def _stored(engine: Engine, run_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.kind) for e in await engine.events(run_id)]


# -- HTTP ----------------------------------------------------------------------------------


async def test_a_client_that_reconnects_with_last_event_id_gets_every_event_once_in_order(
    db_url: str,
) -> None:
    async with serving(db_url) as served, httpx.AsyncClient(timeout=DEADLINE_S) as client:
        engine = served.engine
        run = await engine.start_run("dana", "do the thing")
        stream_url = f"{served.base}/v1/runs/{run.id}/events/stream"
        seen: list[tuple[int, str, dict[str, Any]]] = []
        async with aconnect_sse(client, "GET", stream_url, headers=DANA) as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            driving = asyncio.create_task(engine.run_until_stop(run.id))
            async for sse in source.aiter_sse():
                seen.append((int(sse.id), sse.event, json.loads(sse.data)))
                if sse.event == "suspended":
                    break  # the client goes away mid-run
        assert (await driving).kind is StopKind.SUSPENDED
        await _approve(engine)  # events written while nobody is connected
        driving = asyncio.create_task(engine.run_until_stop(run.id))
        last = str(seen[-1][0])
        # Last-Event-ID wins over ?after=0: nothing is sent twice.
        async with aconnect_sse(
            client, "GET", f"{stream_url}?after=0", headers={**DANA, "Last-Event-ID": last}
        ) as source:
            async for sse in source.aiter_sse():  # ends when the server closes the stream
                seen.append((int(sse.id), sse.event, json.loads(sse.data)))
        assert (await driving).kind is StopKind.ANSWERED
        stored = await _stored(engine, run.id)
    assert [(seq, kind) for seq, kind, _ in seen] == stored
    assert stored[-1][1] == "answered" and {"suspended", "approved"} <= {k for _, k in stored}
    for seq, kind, data in seen:  # each data is the event as GET /events lists it
        assert data["seq"] == seq and data["kind"] == kind and isinstance(data["data"], dict)


async def test_the_stream_of_a_waiting_run_stays_open_with_keep_alive_comments(
    sqlite_url: str,
) -> None:
    async with (
        serving(sqlite_url, keepalive_s=0.05) as served,
        httpx.AsyncClient(timeout=DEADLINE_S) as client,
    ):
        run = await served.engine.start_run("dana", "do the thing")
        assert (await served.engine.run_until_stop(run.id)).kind is StopKind.SUSPENDED
        url = f"{served.base}/v1/runs/{run.id}/events/stream"
        lines: list[str] = []
        async with client.stream("GET", url, headers=DANA) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                lines.append(line)
                if line.startswith(":"):
                    break
    assert ": keep-alive" in lines
    assert "event: suspended" in lines  # the events came first
    ids = [int(line.removeprefix("id: ")) for line in lines if line.startswith("id: ")]
    assert ids == list(range(1, len(ids) + 1))


async def test_the_stream_refuses_bad_input_and_other_users_runs(sqlite_url: str) -> None:
    async with serving(sqlite_url) as served, httpx.AsyncClient(timeout=DEADLINE_S) as client:
        run = await served.engine.start_run("dana", "do the thing")
        base = f"{served.base}/v1/runs"
        miguel = {"Authorization": f"Bearer {KEYS['miguel']}"}
        cases = [
            (f"{base}/{run.id}/events/stream?after=-1", DANA, 422, "invalid_input"),
            (f"{base}/{run.id}/events/stream?after=x", DANA, 422, "invalid_input"),
            (f"{base}/{run.id}/events/stream", {**DANA, "Last-Event-ID": "1.5"}, 422, None),
            # Digits that str.isdigit accepts but are not ASCII: a superscript, another script's.
            (f"{base}/{run.id}/events/stream?after=%C2%B2", DANA, 422, "invalid_input"),
            (f"{base}/{run.id}/events/stream?after=%D9%A3", DANA, 422, "invalid_input"),
            (f"{base}/{run.id}/events/stream", miguel, 404, "not_found"),
            (f"{base}/nope/events/stream", DANA, 404, "not_found"),
            (f"{base}/{run.id}/events/stream", {}, 401, "unauthenticated"),
        ]
        for url, headers, status, code in cases:
            response = await client.get(url, headers=headers)
            assert response.status_code == status, (url, response.text)
            body = response.json()
            assert body["ok"] is False and body["error"] == (code or "invalid_input"), body
        superscript = [(k.encode(), v.encode()) for k, v in DANA.items()]
        superscript.append((b"last-event-id", "\u00b2".encode("latin-1")))
        response = await client.get(f"{base}/{run.id}/events/stream", headers=superscript)
        assert (response.status_code, response.json()["error"]) == (422, "invalid_input")


async def test_a_stream_that_starts_after_the_end_of_a_finished_run_closes_at_once(
    db_url: str,
) -> None:
    async with serving(db_url) as served, httpx.AsyncClient(timeout=DEADLINE_S) as client:
        engine = served.engine
        run = await engine.start_run("dana", "do the thing")
        await _drive_to_the_end(engine, run.id)
        count = len(await engine.events(run.id))
        url = f"{served.base}/v1/runs/{run.id}/events/stream"
        async with aconnect_sse(client, "GET", url, headers=DANA) as source:
            tail = [int(sse.id) async for sse in source.aiter_sse()]
        assert tail == list(range(1, count + 1))
        async with aconnect_sse(client, "GET", f"{url}?after={count}", headers=DANA) as source:
            assert [sse async for sse in source.aiter_sse()] == []
        listed = (await client.get(f"{served.base}/v1/runs/{run.id}/events", headers=DANA)).json()
        assert [item["seq"] for item in listed["items"]] == tail


# -- Python --------------------------------------------------------------------------------


async def _collect(engine: Engine, run_id: str, after: int = 0) -> list[LiveEvent]:
    return [event async for event in engine.watch(run_id, after=after, user="dana")]


async def test_watch_follows_a_run_to_its_end_and_resumes_after_a_seq(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    run = await engine.start_run("dana", "do the thing")
    watching = asyncio.create_task(_collect(engine, run.id))
    await _drive_to_the_end(engine, run.id)
    events = await asyncio.wait_for(watching, DEADLINE_S)
    stored = await _stored(engine, run.id)
    assert [(e.seq, e.kind) for e in events] == stored
    later = await _collect(engine, run.id, after=3)
    assert [(e.seq, e.kind) for e in later] == stored[3:]
    engine.close()


async def test_a_reader_busy_while_the_run_ends_still_gets_every_event(db_url: str) -> None:
    """The reader holds its first event while the run goes to its end and the feed reads
    the rest: the rest still comes (the watch ended on the end it had read, not on one read
    meanwhile)."""
    engine = inprocess.engine(db_url, script_name="answer")
    run = await engine.start_run("dana", "do the thing")
    watch = engine.watch(run.id)
    first = await asyncio.wait_for(anext(watch), DEADLINE_S)
    assert first.kind == "created"
    assert (await engine.run_until_stop(run.id)).kind is StopKind.ANSWERED
    await until(
        lambda: any(w.ended for w in inprocess.watchers(engine)), what="the feed to read the end"
    )
    rest = [event async for event in watch]
    assert [(e.seq, e.kind) for e in [first, *rest]] == await _stored(engine, run.id)
    engine.close()


async def test_events_and_watch_give_each_event_in_one_shape_with_its_seq(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    run = await engine.start_run("dana", "do the thing")
    await _drive_to_the_end(engine, run.id)
    listed = await engine.events(run.id)
    assert [e.seq for e in listed] == list(range(1, len(listed) + 1))
    assert await _collect(engine, run.id) == listed  # the same records, field for field
    assert await _collect(engine, run.id, after=2) == listed[2:]
    engine.close()


async def test_watch_refuses_another_users_run_and_a_bad_after(sqlite_url: str) -> None:
    engine = inprocess.engine(sqlite_url)
    run = await engine.start_run("dana", "do the thing")
    with pytest.raises(NotFound):
        await anext(engine.watch(run.id, user="miguel"))
    with pytest.raises(NotFound):
        await anext(engine.watch("no-such-run"))
    for bad in (-1, 1.5, True, "x", None):
        with pytest.raises(InvalidInput):
            await anext(engine.watch(run.id, after=bad))  # type: ignore[arg-type]
    engine.close()


async def test_notices_wake_watchers_for_steps_approvals_and_cancels(pg_url: str) -> None:
    engine = inprocess.engine(pg_url, script_name="standard", watch_poll_s=NO_POLL_S)
    run = await engine.start_run("dana", "do the thing")
    kinds: list[str] = []
    arrived = asyncio.Event()

    async def follow() -> None:
        async for event in engine.watch(run.id):
            kinds.append(event.kind)
            arrived.set()

    async def next_kind(kind: str) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while kind not in kinds:
                await arrived.wait()
                arrived.clear()

    watching = asyncio.create_task(follow())
    await next_kind("created")  # the first read
    assert (await engine.run_until_stop(run.id)).kind is StopKind.SUSPENDED  # step writes
    await next_kind("suspended")
    await _approve(engine)  # the claim's statement
    await next_kind("approved")
    await engine.cancel_run(run.id, "dana")
    await asyncio.wait_for(watching, DEADLINE_S)  # cancelled is terminal: the watch ends
    assert kinds[-1] == "cancelled"
    assert kinds == [kind for _, kind in await _stored(engine, run.id)]
    engine.close()


def test_the_watch_example_of_the_integrations_page_prints_what_it_says(tmp_path: Path) -> None:
    page = (processes.ROOT / "docs" / "integrations.md").read_text()
    start = page.index("# watch_example.py")
    (tmp_path / "watch_example.py").write_text(page[start : page.index("```", start)])
    done = subprocess.run(
        [sys.executable, "watch_example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1 created",
        "2 model_turn",
        "3 tool_result",
        "4 model_turn",
        "5 answered",
        "answer: done",
    ]


async def test_many_watchers_of_several_runs_each_get_their_runs_events_from_their_seq(
    db_url: str,
) -> None:
    """One feed serves every watcher of the engine in shared rounds: watchers of one run
    at different SEQs, watchers of other runs, and one that leaves early, each get exactly
    their run's events after their own SEQ."""
    engine = inprocess.engine(db_url, script_name="work")
    runs = [await engine.start_run("dana", f"job {i}") for i in range(3)]
    starts = (0, 1, 2)
    watching = {
        (run.id, after): asyncio.create_task(_collect(engine, run.id, after))
        for run in runs
        for after in starts
    }

    async def leave_after_one(run_id: str) -> list[LiveEvent]:
        async for event in engine.watch(run_id):
            return [event]
        return []

    early = asyncio.create_task(leave_after_one(runs[0].id))
    for run in runs:
        assert (await engine.run_until_stop(run.id)).kind is StopKind.ANSWERED
    async with asyncio.timeout(DEADLINE_S):
        seen = {key: await task for key, task in watching.items()}
        assert [(e.seq, e.kind) for e in await early] == [(1, "created")]
    for (run_id, after), events in seen.items():
        stored = await _stored(engine, run_id)
        assert [(e.seq, e.kind) for e in events] == stored[after:], (run_id, after)
        assert {e.run_id for e in events} == {run_id}
    engine.close()
