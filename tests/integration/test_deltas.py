"""The model's text as it is written (reference §16), on both backends: ``engine.watch(...,
deltas=True)`` and ``GET /v1/runs/{id}/events/stream?deltas=1`` in the carrying process,
and on PostgreSQL from a worker in another process.

What each watcher gets is checked against what was stored: a step's deltas follow each
other from offset 0 without gap or overlap, and join into the text of that step's
``model_turn`` event, which every stored turn has (the final answer's too).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agents
import httpx
import inprocess
import processes
import pytest
from httpx_sse import aconnect_sse
from served import DANA, DEADLINE_S, serving
from waiting import until

from tether import Engine, StopKind
from tether.errors import InvalidInput
from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec, Usage
from tether.results import Delta, LiveEvent

TEXTS = [turn["content"] for turn in agents.SCRIPTS["streamed"]]


def check_texts(items: list[LiveEvent | Delta], texts: list[str], *, whole: bool = True) -> None:
    """Each step's deltas run from 0 without gap or overlap (a delta at 0 starts it again)
    and join into its ``model_turn`` text; every stored turn has one, in order. From
    another process (not ``whole``) the ``model_turn`` may come before the step's last
    deltas, which are then left out (the event holds the whole text): a prefix of it."""
    written: dict[int, str] = {}
    for item in items:
        if isinstance(item, Delta):
            held = "" if item.offset == 0 else written.get(item.step, "")
            assert item.offset == len(held), (item, held)
            assert item.text, item
            written[item.step] = held + item.text
    turns = [e for e in items if isinstance(e, LiveEvent) and e.kind == "model_turn"]
    assert [(e.data["step"], e.data["text"]) for e in turns] == list(enumerate(texts, 1))
    for step, text in written.items():
        assert text == texts[step - 1] if whole else texts[step - 1].startswith(text), step
    kinds = [e.kind for e in items if isinstance(e, LiveEvent)]
    assert kinds[-2:] == ["model_turn", "answered"]


async def _collect(engine: Engine, run_id: str, deltas: bool = False) -> list[LiveEvent | Delta]:
    return [item async for item in engine.watch(run_id, deltas=deltas)]


def watched(engine: Engine) -> bool:
    """Whether a watcher of this process subscribed to deltas."""
    hub = engine._services.deltas
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


class GatedModel(Model):
    """Writes ``first``, waits for ``gate``, writes ``second``: a step held mid-stream."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written = asyncio.Event()

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        raise AssertionError("the engine streams")

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        on_text("first half, ")
        self.written.set()
        await self.gate.wait()
        on_text("second half")
        message = {"role": "assistant", "content": "first half, second half"}
        return ModelResponse(message=message, usage=Usage(), model="gated")


async def test_a_watcher_that_connects_mid_step_first_gets_the_text_so_far(db_url: str) -> None:
    model = GatedModel()
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
    """On PostgreSQL deltas cross processes; on SQLite a watcher in another process than
    the carrying worker gets the stored events and no deltas (reference §16)."""
    engine = inprocess.engine(db_url, watch_poll_s=0.2)
    run = await engine.start_run("dana", "tell me")
    watching = asyncio.create_task(_collect(engine, run.id, deltas=True))
    await until(lambda: watched(engine), what="the watcher to subscribe")
    env = processes.tether_env(db_url, KIT_SCRIPT="streamed")
    done = await asyncio.to_thread(
        processes.tether, "worker", "--exit-when-idle", "--no-reap", env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = await asyncio.wait_for(watching, DEADLINE_S)
    check_texts(seen, TEXTS, whole=False)
    pieces = [d for d in seen if isinstance(d, Delta)]
    if db_url.startswith("postgresql"):
        assert {d.step for d in pieces} == {1, 2}
        assert next(d.offset for d in pieces if d.step == 2) == 0
    else:
        assert pieces == []
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
    check_texts(items, TEXTS, whole=False)
    pieces = [item for item in items if isinstance(item, Delta)]
    assert bool(pieces) is db_url.startswith("postgresql"), pieces
