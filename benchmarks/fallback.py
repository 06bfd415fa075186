"""What falling back costs a step, and what it saves (reference §21).

Runs of one step each (the model answers at once), carried in this process on SQLite
through the real ``openai`` and ``anthropic`` SDKs, talking HTTP to the tests' fake servers
(``tests/support/fakellm.py``). Four ways, alternating run by run:

- ``one model``: ``TETHER_MODEL=anthropic:...``, which answers: the baseline;
- ``list, first up``: ``openai:...|anthropic:...``, the first answering;
- ``list, first down``: the same list, the first model answering every call with a 503:
  each step fails one request and falls back;
- ``one model down once``: ``openai:...`` alone, its first call a 503 and its second an
  answer, with §10's default backoff (``TETHER_MODEL_RETRY_FIRST_S``, 1 s): the outage a
  list rides through.

It prints each way's median and p90 milliseconds from the run's start to its answer, and
ratios to the baseline.

Run: .venv/bin/python benchmarks/fallback.py [--runs 40]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from fakellm import ANTHROPIC_PATH, OPENAI_PATH, FakeLLMServer, Reply, running
from provider_replies import answer

from tether import Agent, Engine, MemoryNotifier, StopKind
from tether.config import Settings
from tether.models import from_spec

OPENAI = "openai:gpt-4o-mini"
ANTHROPIC = "anthropic:claude-haiku-4-5"
WAYS = ("one model", "list, first up", "list, first down", "one model down once")


def _script(way: str, gpt: FakeLLMServer, claude: FakeLLMServer) -> str:
    """Script the servers for one run of ``way``; its ``TETHER_MODEL``."""
    if way == "one model":
        claude.script(answer("anthropic", "done"))
        return ANTHROPIC
    if way == "list, first up":
        gpt.script(answer("openai", "done"))
        return f"{OPENAI}|{ANTHROPIC}"
    if way == "list, first down":
        gpt.script(Reply.failure(503, "overloaded"))
        claude.script(answer("anthropic", "done"))
        return f"{OPENAI}|{ANTHROPIC}"
    gpt.script(Reply.failure(503, "overloaded"), answer("openai", "done"))
    return OPENAI


async def _one(way: str, url: str, gpt: FakeLLMServer, claude: FakeLLMServer) -> float:
    """Milliseconds from a run's start to its answer, carried as a worker would."""
    engine = Engine(
        agent=Agent(name="fallback-bench", system_prompt="Answer."),
        model=from_spec(_script(way, gpt, claude)),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
        migrate=True,  # the first run's engine builds the schema
    )
    try:
        started = time.perf_counter()
        run = await engine.start_run("dana", "q")
        while True:
            outcome = await engine.run_until_stop(run.id)
            if outcome.kind is not StopKind.RELEASED:
                break
            await asyncio.sleep(0.01)  # a backoff: the run is claimable once it has passed
        assert outcome.kind is StopKind.ANSWERED, outcome
        return (time.perf_counter() - started) * 1000
    finally:
        await engine.aclose()


async def _measure(runs: int, gpt: FakeLLMServer, claude: FakeLLMServer) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        for way in WAYS:  # a warm-up run of each way, not counted
            await _one(way, url, gpt, claude)
        for _ in range(runs):
            for way in WAYS:
                times[way].append(await _one(way, url, gpt, claude))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each way")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # each failed call's warning is what is measured
    with running(OPENAI_PATH) as gpt, running(ANTHROPIC_PATH) as claude:
        os.environ.update(
            OPENAI_BASE_URL=f"{gpt.url}/v1",
            OPENAI_API_KEY="sk-bench",
            ANTHROPIC_BASE_URL=claude.url,
            ANTHROPIC_API_KEY="sk-ant-bench",
        )
        times = asyncio.run(_measure(args.runs, gpt, claude))
    base = statistics.median(times["one model"])
    print(f"{args.runs} runs of one step each way, SQLite, through the SDKs over HTTP")
    print(f"{'way':<22}{'median ms':>11}{'p90 ms':>9}{'x baseline':>12}")
    for way in WAYS:
        median = statistics.median(times[way])
        p90 = statistics.quantiles(times[way], n=10)[-1]
        print(f"{way:<22}{median:>11.1f}{p90:>9.1f}{median / base:>12.2f}")


if __name__ == "__main__":
    main()
