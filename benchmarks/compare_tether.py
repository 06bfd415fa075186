"""tether in ``compare.py``, through its public API only.

An ``Engine`` with a ``ScriptedModel`` (N-1 turns that call the read tool ``fetch``, then
the answer) and ``MemoryNotifier``, on ``Settings(database_url=...)`` with ``migrate=True``:
``start_run`` then ``run_until_stop``. tether's own engine opens SQLite in WAL mode with
``synchronous=FULL`` and PostgreSQL sessions with ``synchronous_commit=on``.

The warm-up is a run of the same engine whose limits halt it after 3 steps. Resumption: a
run halted by ``max_steps`` after N steps (``halt_reason`` ``max_steps``), continued in a
fresh process by a new engine with ``continue_run`` granting one more step, then
``run_until_stop`` (which takes that step and halts again).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from compare_common import (
    ANSWER,
    NEVER,
    SYSTEM_PROMPT,
    WARMUP_STEPS,
    Database,
    Resumed,
    Sample,
    call_id,
    expect,
    expect_result,
    query,
    question,
    stored_bytes,
    tool_result,
    verdict,
)

# Both backends' modules (their statements are built when they are imported) come in
# with the rest of tether's imports, before any timer, as the peers' do (LangGraph's
# savers for both backends, DBOS): a system's imports are not what the figures measure.
import tether.store.backend.postgres
import tether.store.backend.sqlite  # noqa: F401
from tether import Agent, Engine, Limits, MemoryNotifier, ScriptedModel, Settings, StopKind, tool

USER = "bench"
# Starts and continuations of the resumption are within this cap (the default caps at 200).
CAP = Limits(max_steps=100_000, max_spend_usd=1e6, max_tool_calls=1_000_000, max_elapsed_ms=10**9)


@tool
def fetch(n: int) -> dict[str, Any]:
    """Fetch a page of records (a read)."""
    return tool_result(n)


def script(steps: int) -> list[dict[str, Any]]:
    """``steps - 1`` turns that call ``fetch``, then the answer."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"id": call_id(i), "name": "fetch", "arguments": {"n": i}}]}
        for i in range(steps - 1)
    ]
    return [*turns, {"content": ANSWER}]


def limits(max_steps: int) -> dict[str, Any]:
    """Limits that stop a run after ``max_steps`` steps and at nothing else."""
    return {
        "max_steps": max_steps,
        "max_tool_calls": max_steps + 10,
        "max_spend_usd": 10_000,
        "max_elapsed_ms": 10**9,
    }


def new_engine(db: Database, steps: int) -> Engine:
    agent = Agent(name="compare", system_prompt=SYSTEM_PROMPT, tools=(fetch,))
    return Engine(
        agent=agent,
        model=ScriptedModel(script(steps)),
        settings=Settings(database_url=db.url, max_limits=CAP),
        notifier=MemoryNotifier(),
        migrate=True,
    )


def check(
    db: Database, run_id: str, *, steps: int, messages: int, state: str, last_n: int
) -> list[str]:
    """Counted in the database: the run's state and steps, its stored messages, and the
    last tool result whole."""
    failures: list[str] = []
    rows = query(db, "SELECT state, steps FROM runs WHERE id = :r", r=run_id)
    expect(failures, "run (state, steps)", rows[0] if rows else None, (state, steps))
    stored = query(db, "SELECT message FROM run_messages WHERE run_id = :r ORDER BY seq", r=run_id)
    expect(failures, "stored messages", len(stored), messages)
    decoded = [json.loads(m) if isinstance(m, str) else m for (m,) in stored]
    tools = [m.get("content") for m in decoded if m.get("role") == "tool"]
    expect_result(failures, tools[-1] if tools else None, last_n)
    return failures


async def _measure(db: Database, steps: int) -> tuple[str, float, int]:
    engine = new_engine(db, steps)
    try:
        warm = await engine.start_run(USER, question(steps), limits=limits(WARMUP_STEPS))
        if (await engine.run_until_stop(warm.id)).kind is not StopKind.HALTED:
            raise RuntimeError("the warm-up run did not halt at its step limit")
        before = stored_bytes(db)
        start = time.perf_counter()
        run = await engine.start_run(USER, question(steps), limits=limits(steps + 10))
        outcome = await engine.run_until_stop(run.id)
        seconds = time.perf_counter() - start
        if outcome.kind is not StopKind.ANSWERED:
            raise RuntimeError(f"the run stopped {outcome.kind.value}")
        return run.id, seconds, stored_bytes(db) - before
    finally:
        await engine.aclose()


def measure(system: str, db: Database, steps: int) -> Sample:
    run_id, seconds, stored = asyncio.run(_measure(db, steps))
    # system, user, then each step's assistant turn and (but the last) its tool result
    failures = check(
        db, run_id, steps=steps, messages=2 * steps + 1, state="answered", last_n=steps - 2
    )
    return Sample.checked(system, db, steps, seconds, stored, failures)


async def _prepare(db: Database, steps: int) -> str:
    engine = new_engine(db, steps + 3)
    try:
        run = await engine.start_run(USER, question(NEVER), limits=limits(steps))
        outcome = await engine.run_until_stop(run.id)
        if outcome.kind is not StopKind.HALTED:
            raise RuntimeError(f"the run to resume stopped {outcome.kind.value}")
        return run.id
    finally:
        await engine.aclose()


def prepare(system: str, db: Database, steps: int) -> str:
    """A run halted by ``max_steps`` after ``steps`` tool steps (its script would go on
    calling ``fetch``)."""
    return asyncio.run(_prepare(db, steps))


async def _resume(db: Database, run_id: str, steps: int) -> float:
    start = time.perf_counter()
    engine = new_engine(db, steps + 3)  # the script goes on past the stored steps
    try:
        await engine.open()
        await engine.continue_run(run_id, USER, limits=limits(steps + 1))
        outcome = await engine.run_until_stop(run_id)
        seconds = time.perf_counter() - start
        if outcome.kind is not StopKind.HALTED:
            raise RuntimeError(f"the resumed run stopped {outcome.kind.value}")
        return seconds
    finally:
        await engine.aclose()


def resume(system: str, db: Database, key: str, steps: int) -> Resumed:
    """A new engine continues the halted run for one more step."""
    failures = check(db, key, steps=steps, messages=2 + 2 * steps, state="halted", last_n=steps - 1)
    seconds = asyncio.run(_resume(db, key, steps))
    failures += check(
        db, key, steps=steps + 1, messages=4 + 2 * steps, state="halted", last_n=steps
    )
    return Resumed(system=system, backend=db.backend, seconds=seconds, check=verdict(failures))
