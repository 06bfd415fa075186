"""Erasing a user with 10,000 runs while other users' runs go on (reference §20).

Per backend, on a fresh database (SQLite: a temp file; PostgreSQL: a temporary database):
``--runs`` (default 10,000) answered runs of one user are written straight to the store in
transactions of 500 (each run with its system and user message, an assistant turn calling
a read, its result, the answer, and three events), beside a few hundred of other users.
Then other users' runs of ``--steps-per-run`` read steps are carried one after another in
this process (``Engine.run_until_stop``, the scripted model); the time between one model
request of a run and its next is a step. Their step latency is measured first alone
(``--baseline`` steps), then while another process erases the user
(``Engine.operator.erase_user``, what ``tether users erase`` calls); only the steps made
between that process's start of the erasure and its answer count as "during", and the
erasure's wall time is timed inside it, from the call to its answer.

Printed per backend: the erasure's time and answer, and the other users' step latency p50
and p99 before and during it, with the ratios during / before. Figures are printed, never
asserted. Run it from the repository root::

    .venv/bin/python benchmarks/erasure.py [--backend sqlite|postgresql|both]
        [--runs 10000] [--baseline 300] [--steps-per-run 10]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from step_overhead import DATABASES

from tether import Agent, Engine, MemoryNotifier, ScriptedModel, Settings, tool
from tether.budget import Limits
from tether.models.base import Message, ModelResponse, ToolSpec
from tether.runs import RunState
from tether.store import Store
from tether.store.creation import insert_run
from tether.store.sql.schema import run_events, run_messages, runs

ERASED = "erased-user"
OTHERS = ("ana", "bo", "cy", "di")
CHUNK = 500
ROOT = Path(__file__).resolve().parents[1]


@tool
def lookup(query: str) -> dict[str, Any]:
    """A read."""
    return {"query": query, "answer": f"about {query}"}


class Timed(ScriptedModel):
    """The scripted model, noting when each request came, run after run (``next_run``)."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        super().__init__(turns)
        self.seen: list[list[float]] = []

    def next_run(self) -> None:
        self.seen.append([])

    def steps(self) -> list[float]:
        """Each step's seconds: from one request of a run to its next."""
        return [b - a for times in self.seen for a, b in itertools.pairwise(times)]

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.seen[-1].append(time.perf_counter())
        return await super().request(messages, tools)


def _turns(steps: int) -> list[dict[str, Any]]:
    call = {"name": "lookup", "arguments": {"query": "x"}}
    return [*({"tool_calls": [call]} for _ in range(steps)), {"content": "done"}]


def _engine(url: str, model: ScriptedModel, *, migrate: bool = False) -> Engine:
    agent = Agent(name="bench", system_prompt="You look things up.", tools=(lookup,))
    return Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
        migrate=migrate,
    )


def fill(store: Store, user: str, count: int) -> None:
    """``count`` answered runs of ``user``, written in transactions of ``CHUNK``."""
    later: list[Message] = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "lookup"}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"answer": "about x"}'},
        {"role": "assistant", "content": "done, " + "words " * 40},
    ]
    for start in range(0, count, CHUNK):
        ids = [uuid.uuid4().hex for _ in range(min(CHUNK, count - start))]
        with store.begin() as conn:
            for run_id in ids:
                insert_run(
                    conn,
                    store.dialect,
                    run_id=run_id,
                    user_id=user,
                    question="what about x? " * 5,
                    route={},
                    limits=Limits(),
                    scope={},
                    versions={},
                    agent_version="bench@1",
                    messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
                )
            conn.execute(
                run_messages.insert(),
                [
                    {"run_id": r, "seq": 2 + i, "message": m}
                    for r in ids
                    for i, m in enumerate(later)
                ],
            )
            conn.execute(
                run_events.insert(),
                [
                    {"run_id": r, "at": time.time(), "kind": k, "data": {"step": 1}}
                    for r in ids
                    for k in ("model_turn", "tool_result", "answered")
                ],
            )
            conn.execute(
                runs.update()
                .where(runs.c.id.in_(ids))
                .values(state=RunState.ANSWERED.value, message_count=5)
            )


async def steps_while(engine: Engine, model: Timed, keep_going: Any, least: int) -> list[float]:
    """Carry other users' runs one after another until ``keep_going()`` is false and at
    least ``least`` steps were seen; each step's seconds (request to next request)."""
    model.seen.clear()
    i = 0
    while keep_going() or len(model.steps()) < least:
        run = await engine.start_run(OTHERS[i % len(OTHERS)], "go")
        model.next_run()
        await engine.run_until_stop(run.id)
        i += 1
    return model.steps()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def trial(url: str, args: argparse.Namespace) -> dict[str, Any]:
    model = Timed(_turns(args.steps_per_run))
    engine = _engine(url, model, migrate=True)
    await engine.open()
    store = engine.runner.store
    started = time.perf_counter()
    fill(store, ERASED, args.runs)
    for user in OTHERS:
        fill(store, user, 50)
    print(f"  filled {args.runs:,} runs in {time.perf_counter() - started:.1f} s", flush=True)
    before = await steps_while(engine, model, lambda: False, args.baseline)
    env = {**os.environ, "TETHER_DATABASE_URL": url, "PYTHONPATH": str(ROOT / "benchmarks")}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--erase-child",
        ERASED,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert child.stdout is not None
    await child.stdout.readline()  # its engine is open: the erasure starts now
    answer = asyncio.ensure_future(child.stdout.readline())
    during = await steps_while(engine, model, lambda: not answer.done(), 0)
    result = json.loads(await answer)
    await child.wait()
    with store.engine.connect() as conn:
        left = conn.execute(sa.select(sa.func.count()).where(runs.c.user_id == ERASED)).scalar()
    engine.close()
    return {"before": before, "during": during, "left": left, **result}


async def erase_child(user: str) -> None:
    """In a process of its own: erase ``user`` and print the answer and its time."""
    engine = _engine(os.environ["TETHER_DATABASE_URL"], ScriptedModel([]))
    await engine.open()
    print("open", flush=True)
    start = time.perf_counter()
    erased = await engine.operator.erase_user(user)
    elapsed = time.perf_counter() - start
    engine.close()
    print(json.dumps({"erased": erased.to_json(), "seconds": elapsed}), flush=True)


def report(backend: str, figures: dict[str, Any]) -> str:
    before, during = figures["before"], figures["during"]
    p50 = (_p(before, 0.5), _p(during, 0.5))
    p99 = (_p(before, 0.99), _p(during, 0.99))
    return "\n".join(
        [
            f"{backend} (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})",
            f"  erasure: {figures['seconds']:.1f} s, {figures['erased']} "
            f"({figures['left']} runs of the user left)",
            f"  other users' steps: {len(before)} before, {len(during)} during",
            f"  step p50 ms: before {p50[0]:.2f}, during {p50[1]:.2f}, ratio {p50[1] / p50[0]:.2f}",
            f"  step p99 ms: before {p99[0]:.2f}, during {p99[1]:.2f}, ratio {p99[1] / p99[0]:.2f}",
            f"  median step ms: before {statistics.median(before) * 1000:.2f}",
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Erasing a user while others' runs go on.")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=300)
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--erase-child", metavar="USER", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.erase_child:
        asyncio.run(erase_child(args.erase_child))
        return
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    for backend in backends:
        print(f"{backend}: {args.runs:,} runs of one user, erased", flush=True)
        with DATABASES[backend]() as url:
            figures = asyncio.run(trial(url, args))
        print(report(backend, figures), flush=True)


if __name__ == "__main__":
    main()
