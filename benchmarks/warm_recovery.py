"""Recovering an orphaned long run in a warm worker: from the reaper's claim to the next
model request, against the floor's one read of the same rows.

Per backend, on a fresh database, one engine (its statements compiled, its connections
open: a worker that has been running) and ``--repeat`` rounds. Each round makes an orphan
of a run of ``--steps`` (200) tool steps of ``compare.py``'s workload (8 KiB tool results:
about 1.6 MB of messages): carried by the engine, halted at its step limit, continued,
claimed by an owner that then "dies", and its heartbeat made stale (setup, not timed).
Then it is timed along the path a worker's reaper pass takes, with the runner a ``Worker``
owns: the orphan claimed (``claim_orphans``), reconciled (its history read) and carried on
in the same slot (``recover(..., carry_on=True)``) until the model is asked for the next
step (the clock stops when the model's request begins).

The floor: the same run's rows read on the bare driver in the same process, on a
connection kept open (SQLite's ``sqlite3``, PostgreSQL's ``psycopg``): the run's row by
its id, then its messages in order, each decoded from JSON. Read once right after the
recovery, that connection's first read of them (``floor``), as the recovery reads them
once right after the run's last writes; then three times more, the least of those
(``warm``: the pages in that connection's cache, on PostgreSQL every tuple's commit
already checked, which a recovery never finds). The recovery reads first, so a cost of
the first read of the rows that any reader pays once (PostgreSQL's hint bits) falls on it.

Prints the median and p90 of the path, the median of each floor and the ratios of the
medians (goal: at most 1.5 against ``floor``), and the median of each part of the path.
Figures, not assertions.

Run: .venv/bin/python benchmarks/warm_recovery.py [--steps 200] [--repeat 7]
    [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from compare_common import (  # noqa: E402
    SYSTEM_PROMPT,
    Database,
    call_id,
    create_database,
    drop_database,
    question,
)
from compare_tether import fetch, limits  # noqa: E402

from tether import (  # noqa: E402
    Agent,
    Engine,
    MemoryNotifier,
    ScriptedModel,
    Settings,
    StopKind,
)
from tether.budget import Limits  # noqa: E402
from tether.models.base import Message, ModelResponse, ToolSpec  # noqa: E402
from tether.store.sql.schema import runs  # noqa: E402

USER = "bench"
DEAD = "dead-host:1:00000000"  # the owner that crashed
CAP = Limits(max_steps=100_000, max_spend_usd=1e6, max_tool_calls=1_000_000, max_elapsed_ms=10**9)
NEVER = 10**6


class Stamped(ScriptedModel):
    """The scripted workload, noting when each request begins."""

    asked_at: float = 0.0

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.asked_at = time.perf_counter()
        return await super().request(messages, tools)

    async def stream(self, messages: list[Message], tools: list[ToolSpec], on_text: Any) -> Any:
        self.asked_at = time.perf_counter()
        return await super().stream(messages, tools, on_text)


def _script(turns: int) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"id": call_id(i), "name": "fetch", "arguments": {"n": i}}]}
        for i in range(turns)
    ]


async def _orphan(engine: Engine, steps: int) -> str:
    """A run of ``steps`` tool steps whose owner died: carried, halted at its limit,
    continued by one step, claimed by ``DEAD`` and its heartbeat made stale."""
    run = await engine.start_run(USER, question(NEVER), limits=limits(steps))
    if (await engine.run_until_stop(run.id)).kind is not StopKind.HALTED:
        raise RuntimeError("the run to orphan did not halt at its step limit")
    await engine.continue_run(run.id, USER, limits=limits(steps + 1))
    store = engine.runner.store
    if store.claim_ready(DEAD, run.id) is None:
        raise RuntimeError("the run to orphan could not be claimed")
    with store.engine.begin() as conn:
        stale = runs.c.heartbeat_at - 3600
        conn.execute(runs.update().where(runs.c.id == run.id).values(heartbeat_at=stale))
    return run.id


async def _recover(engine: Engine, model: Stamped, run_id: str) -> dict[str, float]:
    """The reaper's path of a worker for the orphan ``run_id``, timed to the next model
    request: the claim, the reconciliation, and the carrying on (``Worker`` recovers an
    orphan claimed into its slot with ``carry_on``)."""
    runner = engine.runner
    marks: dict[str, float] = {}
    start = time.perf_counter()
    claim = await runner.claim_orphans(1)
    marks["claimed"] = time.perf_counter()
    if [r.id for r in claim.claimed] != [run_id]:
        raise RuntimeError(f"the claim took {claim}")

    def reconciled() -> None:
        marks["reconciled"] = time.perf_counter()

    outcome = await runner.recover(claim.claimed[0], carry_on=True, reconciled=reconciled)
    if outcome.kind is not StopKind.HALTED:
        raise RuntimeError(f"the recovered run stopped {outcome.kind.value}")
    asked = model.asked_at
    return {
        "total": asked - start,
        "claim": marks["claimed"] - start,
        "recover": marks["reconciled"] - marks["claimed"],
        "to_model": asked - marks["reconciled"],
    }


def _floor_read(db: Database, conn: Any, run_id: str) -> float:
    """The run's row and its messages, decoded, on the bare driver: seconds."""
    start = time.perf_counter()
    if db.backend == "sqlite":
        conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        rows = conn.execute(
            "SELECT message FROM run_messages WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
        messages = [json.loads(m) for (m,) in rows]
    else:
        conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
        rows = conn.execute(
            "SELECT message::text FROM run_messages WHERE run_id = %s ORDER BY seq", (run_id,)
        ).fetchall()
        messages = [json.loads(m) for (m,) in rows]
    took = time.perf_counter() - start
    if len(messages) < 2:
        raise RuntimeError("the floor read no messages")
    return took


def _connect(db: Database) -> Any:
    if db.backend == "sqlite":
        return sqlite3.connect(db.path)
    return psycopg.connect(db.url, autocommit=True)


async def _rounds(db: Database, steps: int, repeat: int) -> dict[str, list[float]]:
    model = Stamped(_script(NEVER // 1000))
    agent = Agent(name="compare", system_prompt=SYSTEM_PROMPT, tools=(fetch,))
    engine = Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=db.url, max_limits=CAP, heartbeat_timeout_s=30),
        notifier=MemoryNotifier(),
        migrate=True,
    )
    floor = _connect(db)
    seen: dict[str, list[float]] = {"floor": [], "warm": []}
    try:
        warm = await _orphan(engine, 3)  # compiles every statement of the path
        await _recover(engine, model, warm)
        for _ in range(repeat):
            run_id = await _orphan(engine, steps)
            for part, took in (await _recover(engine, model, run_id)).items():
                seen.setdefault(part, []).append(took)
            seen["floor"].append(_floor_read(db, floor, run_id))
            seen["warm"].append(min(_floor_read(db, floor, run_id) for _ in range(3)))
    finally:
        floor.close()
        await engine.aclose()
    return seen


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    print(f"an orphan of {args.steps} steps, {args.repeat} rounds a backend")
    head = f"{'backend':11s}{'path':>8s}{'p90':>8s}"
    head += f"{'floor':>8s}{'ratio':>7s}{'warm':>7s}{'ratio':>7s}"
    print(f"{head}   parts (median ms)")
    for backend in args.backends.split(","):
        db = create_database(backend)
        try:
            seen = asyncio.run(_rounds(db, args.steps, args.repeat))
        finally:
            drop_database(db)
        total, floor = statistics.median(seen["total"]), statistics.median(seen["floor"])
        warm = statistics.median(seen["warm"])
        parts = "  ".join(
            f"{part} {1000 * statistics.median(seen[part]):.1f}"
            for part in ("claim", "recover", "to_model")
        )
        print(
            f"{backend:11s}{1000 * total:8.1f}{_ms(seen['total'], 0.9):8.1f}"
            f"{1000 * floor:8.1f}{total / floor:7.2f}"
            f"{1000 * warm:7.1f}{total / warm:7.2f}   {parts}"
        )


if __name__ == "__main__":
    main()
