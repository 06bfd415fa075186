"""``tether keys rotate`` (reference §20): stored values re-sealed per second, on SQLite and
PostgreSQL, and a worker's step time while a rotation runs beside it against before.

On a fresh database an in-process engine whose content is sealed under key ``old`` carries
``--runs`` (200) runs of ``--steps`` (5) read steps each to their answers (each step stores
a turn, its ledger entry, a ~2 KB result and their events). Then, with the keys
``new,old``, the rotation re-seals every stored value under ``new`` (``--batch`` values per
transaction) while a second engine carries one more long run; its median and p99 step
time during the rotation is printed against the same run's steps before it started.
Figures, not assertions. About 30 s a backend.

Run: .venv/bin/python benchmarks/key_rotation.py [--runs 200] [--steps 5] [--batch 500]
     [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare_common import fresh_database  # noqa: E402
from step_overhead import StampedModel, script  # noqa: E402

from tether import Agent, Engine, MemoryNotifier, StopKind, tool  # noqa: E402
from tether.budget import Limits  # noqa: E402
from tether.config import Settings  # noqa: E402
from tether.sealing import Keyring, new_key, parse_keys  # noqa: E402

PAD = "lorem ipsum dolor sit amet " * 80  # ~2 KB per result


@tool
def fetch(n: int) -> dict[str, Any]:
    """Fetch a page (a read)."""
    return {"n": n, "text": PAD}


def engine(url: str, keyring: Keyring, steps: int) -> tuple[Engine, StampedModel]:
    model = StampedModel(script(steps))
    agent = Agent(name="bench", system_prompt="You fetch pages.", tools=(fetch,))
    limits = Limits(max_steps=steps + 10, max_tool_calls=steps + 10)
    made = Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=url, keyring=keyring, default_limits=limits),
        notifier=MemoryNotifier(),
        migrate=True,
    )
    return made, model


async def fill(eng: Engine, runs: int) -> None:
    for i in range(runs):
        outcome = await eng.ask("bench", f"fetch {i}")
        if outcome.kind is not StopKind.ANSWERED:
            raise RuntimeError(f"run {i} stopped {outcome.kind.value}")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def measure(backend: str, runs: int, steps: int, batch: int) -> None:
    old = f"old:{new_key()}"
    both = parse_keys(f"new:{new_key()},{old}")
    first = parse_keys(old)
    assert first is not None
    assert both is not None
    with fresh_database(backend) as db:
        filler, _ = engine(db.url, first, steps)
        asyncio.run(fill(filler, runs))
        filler.close()
        rotator, _ = engine(db.url, both, steps)
        busy, model = engine(db.url, both, 180)
        asyncio.run(busy.open())
        asyncio.run(rotator.open())
        rotating = threading.Event()
        span: list[float] = []

        def rotate() -> None:
            rotating.wait()
            start = time.perf_counter()
            done = asyncio.run(rotator.operator.rotate_keys(batch=batch))
            span.extend([start, time.perf_counter(), float(done.total)])

        thread = threading.Thread(target=rotate)
        thread.start()

        async def carry() -> None:
            run = await busy.start_run("other", "a long run")
            task = asyncio.create_task(busy.run_until_stop(run.id))
            while len(model.starts) < 60:
                await asyncio.sleep(0.01)
            rotating.set()
            await task

        asyncio.run(carry())
        thread.join()
        busy.close()
        rotator.close()
    start, end, total = span
    steps_at = model.starts
    gaps = [(a, b - a) for a, b in pairwise(steps_at)]
    before = [g for at, g in gaps if at < start]
    during = [g for at, g in gaps if start <= at < end]
    print(
        f"{backend}: {int(total):,} values re-sealed in {end - start:.2f} s "
        f"({total / (end - start):,.0f} values/s, batch {batch}); load {os.getloadavg()[0]:.2f}"
    )
    if before and during:
        print(
            f"  another run's step: before p50 {statistics.median(before) * 1000:.2f} ms, "
            f"p99 {_p(before, 0.99):.2f} ms; during p50 "
            f"{statistics.median(during) * 1000:.2f} ms, p99 {_p(during, 0.99):.2f} ms "
            f"({statistics.median(during) / statistics.median(before):.2f}x at p50, "
            f"{len(during)} steps)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="tether keys rotate: values per second.")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        measure(backend, args.runs, args.steps, args.batch)


if __name__ == "__main__":
    main()
