"""The model's text as it is written (reference §16), on both backends: ``engine.watch(...,
deltas=True)`` and ``GET /v1/runs/{id}/events/stream?deltas=1`` in the carrying process,
and on PostgreSQL from a worker in another process.

What each watcher gets is checked against what was stored: a step's deltas follow each
other from offset 0 without gap or overlap, all before that step's ``model_turn`` event
(which every stored turn has, the final answer's too), and join into its text to the end:
in one process, from a worker in another, and for watchers that come one after another.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agents
import gated
import httpx
import inprocess
import processes
import psycopg
import pytest
from httpx_sse import aconnect_sse
from served import DANA, DEADLINE_S, serving
from waiting import poll_until, until

from tether import Engine, StopKind
from tether._runtime.live.deltas import DeltaHub
from tether.errors import InvalidInput
from tether.results import Delta, LiveEvent
from tether.store.backend.listen import DELTAS_CHANNEL
from tether.store.backend.listening import Subscriber

TEXTS = [turn["content"] for turn in agents.SCRIPTS["streamed"]]
STEP_TEXTS = [turn["content"] for turn in agents.SCRIPTS["streamed_steps"]]


def check_texts(items: list[LiveEvent | Delta], texts: list[str]) -> None:
    """Each step's deltas run from 0 without gap or overlap (a delta at 0 starts it again),
    all before its ``model_turn``, and join into that event's text, to its end; every stored
    turn has one, in order."""
    written: dict[int, str] = {}
    stored: set[int] = set()
    for item in items:
        if isinstance(item, Delta):
            assert item.step not in stored, ("a delta after its step's model_turn", item)
            held = "" if item.offset == 0 else written.get(item.step, "")
            assert item.offset == len(held), (item, held)
            assert item.text, item
            written[item.step] = held + item.text
        elif item.kind == "model_turn":
            step = int(item.data["step"])
            stored.add(step)
            assert written.get(step, item.data["text"]) == item.data["text"], step
    turns = [e for e in items if isinstance(e, LiveEvent) and e.kind == "model_turn"]
    assert [(e.data["step"], e.data["text"]) for e in turns] == list(enumerate(texts, 1))
    kinds = [e.kind for e in items if isinstance(e, LiveEvent)]
    assert kinds[-2:] == ["model_turn", "answered"]


async def _collect(engine: Engine, run_id: str, deltas: bool = False) -> list[LiveEvent | Delta]:
    return [item async for item in engine.watch(run_id, deltas=deltas)]


def watched(engine: Engine) -> bool:
    """Whether a watcher of this process subscribed to deltas."""
    hub = engine.runner.services.deltas
    assert hub is not None
    return any(run.watchers for run in hub._runs.values())


async def test_a_watcher_gets_each_step_s_text_as_it_is_written(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="streamed")
    run = await engine.start_run("dana", "tell me")
    with_deltas = asyncio.create_task(_collect(engine, run.id, deltas=True))
    without = asyncio.create_task(_collect(engine, run.id))
    await until(lambda: watched(engine), what="the watcher to subscribe")
    assert (await engine.run_until_stop(run.id)).kind is StopKind.ANSWERED
    async with asyncio.timeout(DEADLINE_S):
        seen, plain = await with_deltas, await without
    check_texts(seen, TEXTS)
    pieces = [d for d in seen if isinstance(d, Delta)]
    assert {d.step for d in pieces} == {1, 2} and len(pieces) > 10  # many pieces, not one
    assert not any(isinstance(e, Delta) for e in plain)
    assert [e.kind for e in plain] == [e.kind for e in seen if isinstance(e, LiveEvent)]
    engine.close()


async def test_a_watcher_that_connects_mid_step_first_gets_the_text_so_far(db_url: str) -> None:
    model = gated.GatedModel()
    engine = inprocess.engine(db_url, model=model)
    run = await engine.start_run("dana", "tell me")
    driving = asyncio.create_task(engine.run_until_stop(run.id))
    await asyncio.wait_for(model.written.wait(), DEADLINE_S)
    late = engine.watch(run.id, deltas=True)
    first = await asyncio.wait_for(anext(late), DEADLINE_S)
    while isinstance(first, LiveEvent):  # the stored events first (created)
        first = await asyncio.wait_for(anext(late), DEADLINE_S)
    assert (first.step, first.offset, first.text, first.catch_up) == (1, 0, "first half, ", True)
    model.gate.set()
    rest = [item async for item in late]
    check_texts([first, *rest], ["first half, second half"])
    assert (await driving).kind is StopKind.ANSWERED
    engine.close()


async def test_a_reader_that_lags_gets_a_step_s_last_deltas_before_its_model_turn(
    db_url: str,
) -> None:
    """The step's last piece is written, and its turn stored and read by the feed, while
    the reader is still busy with the step's first delta: the last piece still comes before
    the ``model_turn`` (it was left out once that event had gone)."""
    model = gated.GatedModel()
    engine = inprocess.engine(db_url, model=model)
    run = await engine.start_run("dana", "tell me")
    driving = asyncio.create_task(engine.run_until_stop(run.id))
    await asyncio.wait_for(model.written.wait(), DEADLINE_S)
    watch = engine.watch(run.id, deltas=True)
    seen: list[LiveEvent | Delta] = []
    while not any(isinstance(item, Delta) for item in seen):
        seen.append(await asyncio.wait_for(anext(watch), DEADLINE_S))
    model.gate.set()  # the reader holds its first delta while the step ends
    assert (await driving).kind is StopKind.ANSWERED

    def turn_read() -> bool:
        return any(e.kind == "model_turn" for w in inprocess.watchers(engine) for e in w.read)

    await until(turn_read, what="the feed to read the stored turn")
    seen += [item async for item in watch]
    check_texts(seen, ["first half, second half"])
    engine.close()


async def test_deltas_must_be_a_bool(sqlite_url: str) -> None:
    engine = inprocess.engine(sqlite_url)
    run = await engine.start_run("dana", "tell me")
    with pytest.raises(InvalidInput):
        await anext(engine.watch(run.id, deltas="yes"))  # type: ignore[call-overload]
    engine.close()


async def test_the_stream_sends_deltas_without_ids_when_asked(db_url: str) -> None:
    async with (
        serving(db_url, script_name="streamed") as served,
        httpx.AsyncClient(timeout=DEADLINE_S) as client,
    ):
        run = await served.engine.start_run("dana", "tell me")
        url = f"{served.base}/v1/runs/{run.id}/events/stream"
        for bad in ("yes", "2", ""):
            refused = await client.get(url, params={"deltas": bad}, headers=DANA)
            assert refused.status_code == 422, bad
            assert refused.json()["error"] == "invalid_input"
        seen: list[LiveEvent | Delta] = []
        ids: list[tuple[str, str]] = []  # (a delta's last event id, the last event's id)
        last = [""]

        async def read() -> None:
            async with aconnect_sse(client, "GET", f"{url}?deltas=1", headers=DANA) as sse:
                async for message in sse.aiter_sse():
                    data = json.loads(message.data)
                    if message.event == "delta":
                        assert set(data) == {"step", "offset", "text"}
                        ids.append((message.id, last[0]))
                        seen.append(Delta(run_id=run.id, **data))
                    else:
                        last[0] = message.id
                        seen.append(_live(run.id, message.event, data))

        reading = asyncio.create_task(read())
        await until(lambda: watched(served.engine), what="the stream to start")
        assert (await served.engine.run_until_stop(run.id)).kind is StopKind.ANSWERED
        await asyncio.wait_for(reading, DEADLINE_S)
    check_texts(seen, TEXTS)
    # No delta carries an id: the last event id a delta leaves (SSE keeps the last one
    # seen) is always the one of the durable event before it.
    assert ids and all(delta_id == event_id for delta_id, event_id in ids), ids


def _live(run_id: str, kind: str, data: dict[str, object]) -> LiveEvent:
    inner = data["data"]
    assert isinstance(inner, dict)
    return LiveEvent(id=0, seq=int(str(data["seq"])), run_id=run_id, at=0, kind=kind, data=inner)


async def test_a_worker_in_another_process_streams_to_watchers_here_on_postgresql(
    db_url: str, tmp_path: Path
) -> None:
    """On PostgreSQL deltas cross processes, each step's to its end before its
    ``model_turn``: ten steps, each stored as soon as its last piece is written, the pieces
    further apart than the worker's batch of notices (25 ms), so a step's last piece goes
    in a batch of its own (it used to reach the watcher after the stored turn in most
    steps). On SQLite a watcher in another process than the carrying worker gets the
    stored events and no deltas (reference §16)."""
    engine = inprocess.engine(db_url, watch_poll_s=0.2)
    run = await engine.start_run("dana", "tell me")
    watching = asyncio.create_task(_collect(engine, run.id, deltas=True))
    await until(lambda: watched(engine), what="the watcher to subscribe")
    env = processes.tether_env(db_url, KIT_SCRIPT="streamed_steps", KIT_STREAM_DELAY_S="0.05")
    done = await asyncio.to_thread(
        processes.tether, "worker", "--exit-when-idle", "--no-reap", env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = await asyncio.wait_for(watching, DEADLINE_S)
    check_texts(seen, STEP_TEXTS)
    steps = {d.step for d in seen if isinstance(d, Delta)}
    if db_url.startswith("postgresql"):  # the first may end before the ask reached it
        assert set(range(2, 11)) <= steps, steps
    else:
        assert steps == set()
    engine.close()


async def test_runs_watch_deltas_prints_the_text_as_it_comes(db_url: str, tmp_path: Path) -> None:
    """``tether runs watch --deltas`` in its own process, a worker in another: the text
    comes between the events as JSON lines on PostgreSQL; on SQLite the events only."""
    engine = inprocess.engine(db_url)
    run = await engine.start_run("dana", "tell me")
    engine.close()
    env = processes.tether_env(db_url, KIT_SCRIPT="streamed")
    out = tmp_path / "watch.log"
    watcher = processes.spawn("runs", "watch", run.id, "--deltas", env=env, log=out)
    try:
        await until(lambda: '"created"' in out.read_text(), what="the watcher's first line")
        done = await asyncio.to_thread(
            processes.tether, "worker", "--exit-when-idle", "--no-reap", env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert await asyncio.to_thread(watcher.wait, DEADLINE_S) == 0, out.read_text()
    finally:
        watcher.kill()
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    items: list[LiveEvent | Delta] = [
        Delta(run_id=run.id, step=line["step"], offset=line["offset"], text=line["text"])
        if line["kind"] == "delta"
        else _live(run.id, line["kind"], line)
        for line in lines
    ]
    check_texts(items, TEXTS)
    pieces = [item for item in items if isinstance(item, Delta)]
    assert bool(pieces) is db_url.startswith("postgresql"), pieces


async def test_watchers_one_after_another_each_get_their_run_s_text(pg_url: str) -> None:
    """A watcher that connects as the one before it (of another run) hangs up, as a page
    reloaded: the process's listener, let go of and wanted again before its thread looked,
    listens on, and the new watcher's ask goes at once. The worker carries the runs one
    after another; each watcher follows one and hangs up when it ends."""
    engine = inprocess.engine(pg_url)
    runs = [(await engine.start_run("dana", f"tell me ({i})")).id for i in range(3)]
    env = processes.tether_env(pg_url, KIT_SCRIPT="streamed", KIT_STREAM_DELAY_S="0.05")
    args = ("worker", "--exit-when-idle", "--no-reap", "--concurrency", "1")
    carrying = asyncio.create_task(asyncio.to_thread(processes.tether, *args, env=env))
    for i, run_id in enumerate(runs):
        async with asyncio.timeout(DEADLINE_S):
            seen = await _collect(engine, run_id, deltas=True)
        check_texts(seen, TEXTS)
        if i:  # the first run's first step may end before the worker heard its ask
            assert {d.step for d in seen if isinstance(d, Delta)} == {1, 2}, i
    done = await asyncio.wait_for(carrying, DEADLINE_S)
    assert done.returncode == 0, done.stderr[-3000:]
    engine.close()


async def test_a_watching_process_has_a_step_s_text_to_its_end_once_it_looks(
    pg_url: str,
) -> None:
    """Two hubs on one database are two processes. Once the carrying one's model call has
    returned (its turn is stored next), a ``caught_up`` of the watching one returns only
    with every piece of the step queued for its watcher, the last ones written in a burst."""
    carrier, watching = DeltaHub(pg_url), DeltaHub(pg_url)
    sub = watching.subscribe("r1", lambda: None)
    got: list[Delta] = []

    def taken() -> list[Delta]:
        got.extend(sub.take())
        return got

    pieces = [f"piece {i}; " for i in range(300)]
    try:
        async with carrier.stream("r1", 1) as write:
            write(pieces[0])
            await until(taken, what="the watching hub's ask, then the text so far")
            for piece in pieces[1:]:
                write(piece)
        await sub.caught_up([(1, "".join(pieces))])
        text = ""
        for delta in taken():
            assert delta.step == 1 and delta.offset in (0, len(text)), delta
            text = text[: delta.offset] + delta.text
        assert text == "".join(pieces)
    finally:
        sub.close()
        carrier.quiet()
        watching.quiet()


def test_a_listener_let_go_of_and_wanted_again_at_once_listens_on(pg_url: str) -> None:
    heard: list[str] = []
    listener = Subscriber(
        pg_url,
        on_notice=lambda _channel, payload: heard.append(payload),
        on_connect=lambda: None,
        on_tick=lambda: None,
    )
    listener.want(frozenset({DELTAS_CHANNEL}))
    poll_until(lambda: listener.connected, what="the listener to listen")
    listener.want(frozenset())  # the last watcher leaves...
    listener.want(frozenset({DELTAS_CHANNEL}))  # ...and the next comes before the thread looks
    poll_until(lambda: listener.connected, what="the listener to say it listens")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, 'hello')", (DELTAS_CHANNEL,))
    poll_until(lambda: "hello" in heard, what="the notice")
    listener.want(frozenset())
    poll_until(lambda: not listener.listener.running, what="the listener to stop")
