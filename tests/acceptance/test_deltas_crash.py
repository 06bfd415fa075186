"""A worker SIGKILLed while the model's text streams (reference §16, §7): the watcher keeps
watching, the recovered step's text starts again at offset 0, and the stored turn is
whole. The worker is a ``tether worker`` process; recovery (the reaper's release, then
the carry) is this test's process, where the watcher is. On PostgreSQL the watcher also
gets the killed worker's deltas across processes, so the kill is mid-stream; on SQLite
those never reach it, and the kill comes just after the first step was stored.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import agents
import inprocess
import processes
from waiting import until

from tether import StopKind
from tether.results import Delta, LiveEvent

TEXTS = [turn["content"] for turn in agents.SCRIPTS["streamed"]]
DEADLINE_S = 60.0


async def test_a_worker_killed_mid_stream_restarts_the_step_at_offset_0(
    db_url: str, tmp_path: Path
) -> None:
    cross = db_url.startswith("postgresql")
    engine = inprocess.engine(db_url, script_name="streamed", heartbeat_timeout_s=0.3)
    run = await engine.start_run("dana", "tell me")
    seen: list[LiveEvent | Delta] = []

    async def watch() -> None:
        async for item in engine.watch(run.id, deltas=True):
            seen.append(item)

    watching = asyncio.create_task(watch())
    env = processes.tether_env(db_url, KIT_SCRIPT="streamed", KIT_STREAM_DELAY_S="0.1")
    worker = processes.spawn("worker", "--no-reap", env=env, log=tmp_path / "worker.log")
    try:

        def mid_stream() -> bool:
            turned = any(isinstance(i, LiveEvent) and i.kind == "model_turn" for i in seen)
            if cross:  # some of the answer's text came from the worker's process
                # The first turn's stored event and the answer's live text reach the
                # watcher by two ways (the event feed, the deltas' notices), in either
                # order: wait for both.
                return turned and any(isinstance(i, Delta) and i.step == 2 for i in seen)
            return turned

        await until(mid_stream, timeout=DEADLINE_S, what="the answer to be streaming")
        worker.send_signal(signal.SIGKILL)
        assert await asyncio.to_thread(worker.wait, 30) == -signal.SIGKILL
    finally:
        worker.kill()
    killed_at = len(seen)
    stored = [i.data["step"] for i in seen if isinstance(i, LiveEvent) and i.kind == "model_turn"]
    assert stored == [1]  # killed while the answer's turn was not stored

    def stale() -> bool:
        current = engine.runner.store.get_run(run.id)
        assert current is not None
        return engine.runner.store.now() - (current.heartbeat_at or 0) > 0.35

    await until(stale, timeout=DEADLINE_S, what="the killed worker's heartbeat to go stale")
    assert run.id in (await engine.operator.reap()).recovered
    assert (await engine.run_until_stop(run.id)).kind is StopKind.ANSWERED
    await asyncio.wait_for(watching, DEADLINE_S)

    after = seen[killed_at:]
    restarted = [i for i in after if isinstance(i, Delta) and i.step == 2]
    assert restarted and restarted[0].offset == 0, restarted[:3]
    # From the restart on, the step's text follows on without gap or overlap to its end.
    text = ""
    for delta in restarted:
        text = delta.text if delta.offset == 0 else text + delta.text
        assert delta.offset == 0 or len(text) - len(delta.text) == delta.offset
    assert text == TEXTS[1]
    turns = [i for i in seen if isinstance(i, LiveEvent) and i.kind == "model_turn"]
    assert [(t.data["step"], t.data["text"]) for t in turns] == list(enumerate(TEXTS, 1))
    view = await engine.get_run(run.id)
    assert view.messages[-1]["content"] == TEXTS[1]
    engine.close()
