"""Idempotent creation: what an ``Idempotency-Key`` costs a ``POST /v1/runs``.

The real app (``tether.api.app.create_app``) over an in-process ASGI client (httpx), on
SQLite (a temp file: WAL, ``synchronous=FULL``) and on PostgreSQL (a temporary database);
no worker runs, so each request is only the creation: authentication, validation, the
scope, the run's transaction. Per backend, ``--requests`` (default 200) requests with a
fresh ``Idempotency-Key`` each and as many without a key (the baseline, in the same
process, on the same database), in alternating blocks of ``--block`` (default 20) so that
load that varies over time weighs on both. For information, the same number of repeats of
one key (answered by the key's look-up, creating nothing).

Printed per backend: the median latency of each kind, and keyed / unkeyed (target
<= 1.10). Figures are printed, never asserted. Run it from the repository root::

    .venv/bin/python benchmarks/idempotency.py [--backend sqlite|postgresql|both]
        [--requests 200] [--block 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import httpx
from step_overhead import DATABASES

from tether import Agent, Engine, MemoryNotifier, ScriptedModel, Settings
from tether.api.app import create_app

TARGET = 1.10
WARMUP = 20
KEY = "bench-api-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"question": "what is the answer?", "limits": {"max_steps": 5}}


@asynccontextmanager
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app over an in-process ASGI client, on a freshly migrated ``url``."""
    agent = Agent(name="bench", system_prompt="You answer.", tools=())
    engine = Engine(
        agent=agent,
        model=ScriptedModel([{"content": "42"}]),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
        migrate=True,
    )
    await engine.operator.add_user("bench", KEY)
    transport = httpx.ASGITransport(app=create_app(engine))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            yield c
    finally:
        engine.close()


async def timed(c: httpx.AsyncClient, key: str | None) -> float:
    """Seconds one ``POST /v1/runs`` took (with ``key`` as its Idempotency-Key)."""
    headers = AUTH if key is None else {**AUTH, "Idempotency-Key": key}
    start = time.perf_counter()
    response = await c.post("/v1/runs", json=BODY, headers=headers)
    elapsed = time.perf_counter() - start
    if response.status_code != 202:
        raise SystemExit(f"POST /v1/runs answered {response.status_code}: {response.text}")
    return elapsed


async def trial(url: str, requests: int, block: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"without a key": [], "a fresh key": [], "a repeat": []}
    async with client(url) as c:
        for i in range(WARMUP):
            await timed(c, None)
            await timed(c, f"warm-{i}")
        await timed(c, "repeated")
        done = 0
        while done < requests:
            n = min(block, requests - done)
            for _ in range(n):
                times["without a key"].append(await timed(c, None))
            for _ in range(n):
                times["a fresh key"].append(await timed(c, uuid.uuid4().hex))
            for _ in range(n):
                times["a repeat"].append(await timed(c, "repeated"))
            done += n
    return times


def report(backend: str, times: dict[str, list[float]]) -> None:
    load = os.getloadavg()[0]
    base = statistics.median(times["without a key"])
    print(f"\n{backend}  ({len(times['without a key'])} requests each; load average {load:.2f})")
    print(f"  {'POST /v1/runs':<16} {'median ms':>10} {'/ without':>10}")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"  {name:<16} {median * 1000:>10.2f} {median / base:>10.3f}")
    ratio = statistics.median(times["a fresh key"]) / base
    verdict = "PASS" if ratio <= TARGET else "MISS"
    print(f"  a fresh key / without: {ratio:.3f} (target <= {TARGET:.2f}: {verdict})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="What an Idempotency-Key costs a creation.")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--block", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    for backend in backends:
        with DATABASES[backend]() as url:
            report(backend, asyncio.run(trial(url, args.requests, args.block)))


if __name__ == "__main__":
    main()
