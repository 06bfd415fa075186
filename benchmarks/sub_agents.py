"""Trees of sub-agents (reference §18): what delegating costs against plain runs, on SQLite
(a file) and PostgreSQL, each backend on a fresh database.

1. ``fanout``: a lead whose first turn hands 50 tasks to the sub-agent ``helper`` (50
   sub-agent calls in one assistant turn), carried by 2 ``tether worker`` processes
   (``--concurrency 50`` each, so every child may be in flight at once) whose model is the
   tests' fake OpenAI server over HTTP (``openai:bench``, in this process; it answers each
   agent by its system prompt and records when each request arrived). Timed from the
   lead's stored turn (its ``model_turn`` event) to the arrival of the 50th child's first
   model request, and from the last child's ``created`` event (inside the transaction
   that stores them all, so the rest is the children's start); against 50 top-level
   runs of ``helper`` started by this process one after another (``start_run``; gathered,
   they take longer on PostgreSQL) on the same workers, timed from the first one's
   creation to the 50th first request (goal: tree / top-level <= 1.5), and from the last
   one's creation. Medians of ``--rounds`` rounds of each, alternating which goes first.
   Each child answers at once, so the lead's second turn ends the round.
2. ``wake``: ``--trees`` trees of one child each, one after another, on the same workers:
   from the child's ``answered`` event to the arrival of the lead's next model request
   (p50, p99); against the same measure for a run made ready by another process: a run
   halted by its ``max_steps`` and continued from this process (``continue_run``), from
   its ``continued`` event to its next model request (one such run after each tree); and,
   for information, from a new run's ``created`` event to its first request. Goal: a wake
   within one claim of a ready run: on PostgreSQL no poll interval waited (workers are
   woken by NOTIFY; their poll is a 5 s fallback), on SQLite none either when the child's
   own worker takes the parent as its slot frees (else its poll, 0.25 s). The verdict: the
   wake's p99 under the poll interval.
3. ``budget``: the tree's one budget check (before each model call, a run of a tree
   reads the figures of its whole tree), in process: ms per step of a run
   at depth 2 (root, then a manager, then the worker run timed) against a top-level run
   of the same agent on the same database, each carried by ``engine.run_until_stop``
   (goal <= 1.15); and 8 children of one root stepping at once, carried by an in-process
   ``Worker`` (concurrency 8), against 8 top-level runs of the same agent carried the
   same way (goal <= 1.15). Each run makes ``--steps`` steps (a ``fetch`` call of a read
   tool each, then the answer); a step is timed from one model request to the next (the
   model stamps them), the median over the run's steps; with 8 at once, also the window
   from the first request to the last over every step taken; and this process's CPU per
   step while they were carried (every thread; on PostgreSQL the server's is left out).
   Medians, and for information the fastest, of ``--pairs`` pairs of single runs and
   ``--repeat`` pairs of 8, alternating which goes first; the verdict is on the medians.

The database's clock (``run_events.at``) and the fake server's (``time.monotonic()``,
turned into the wall clock of this process) are the same machine's clock. Figures are
printed, never asserted; the load average is printed with each part.

Run: .venv/bin/python benchmarks/sub_agents.py [--only fanout,wake,budget]
     [--backends sqlite,postgresql] [--children 50] [--rounds 5] [--trees 100]
     [--steps 60] [--parts 8] [--pairs 21] [--repeat 7] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import bench_agent  # noqa: E402
import throughput  # noqa: E402
from bench_agent import HELPER_PROMPT, LEAD_PROMPT  # noqa: E402
from compare_common import Database, fresh_database  # noqa: E402
from fakellm import OPENAI_PATH, FakeLLMServer, Reply, openai_completion, running  # noqa: E402

from tether import Agent, Engine, MemoryNotifier, ScriptedModel, Settings  # noqa: E402
from tether.budget import Limits  # noqa: E402
from tether.models.base import Message, Model, ModelResponse, ToolSpec  # noqa: E402
from tether.runs import Run, RunState  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402
from tether.worker import Worker  # noqa: E402

GOAL_FANOUT = 1.5
GOAL_BUDGET = 1.15
USER = "bench"
# Limits no run of these benchmarks reaches (the cap raised to allow them): the tree's
# check is made, and measured, but never binds.
ROOMY = {"max_steps": 100_000, "max_tool_calls": 100_000, "max_elapsed_ms": 86_400_000}
CAP = Limits(max_spend_usd=1000.0, **ROOMY)
POLL_S = 0.01  # how often this process looks for a run's end (not part of any figure)
DEADLINE_S = 120.0


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def verdict(ratio: float, goal: float) -> str:
    return "PASS" if ratio <= goal else "MISS"


# -- the fleet: 2 worker processes, the fake model over HTTP --------------------------------


def done() -> Reply:
    return Reply(body=openai_completion(content="done"))


def delegating(tasks: list[str]) -> Reply:
    """A lead's turn that hands each of ``tasks`` to a helper, in one assistant turn."""
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "helper", "arguments": json.dumps({"task": task})},
        }
        for i, task in enumerate(tasks)
    ]
    return Reply(body=openai_completion(tool_calls=calls))


def fetching() -> Reply:
    """A turn that calls the read tool ``fetch``."""
    function = {"name": "fetch", "arguments": json.dumps({"n": 1})}
    return Reply(
        body=openai_completion(
            tool_calls=[{"id": "call_f", "type": "function", "function": function}]
        )
    )


@dataclass
class Fleet:
    """Two ``tether worker`` processes serving ``bench_agent:tree_agent`` on ``db``, the
    fake model they call, and engines of this process that create runs (never carry)."""

    db: Database
    server: FakeLLMServer
    store: Store
    lead: Engine
    helper: Engine
    offset: float = field(default_factory=lambda: time.time() - time.monotonic())

    def wall(self, monotonic: float) -> float:
        """A fake-server arrival (``time.monotonic()``) on the wall clock."""
        return monotonic + self.offset

    def requests(self, since: int, system: str) -> list[tuple[float, str]]:
        """(arrival on the wall clock, the run's question) of each request since the
        ``since``-th whose system prompt starts with ``system``, in arrival order."""
        found = []
        for recorded in self.server.requests[since:]:
            messages = recorded.body["messages"]
            if messages[0]["content"].startswith(system):
                found.append((self.wall(recorded.at), messages[1]["content"]))
        return found

    def event_at(self, run_id: str, kind: str) -> float:
        """When the run's first event of ``kind`` was stored (the database's clock)."""
        return next(e.at for e in self.store.events(run_id) if e.kind == kind)

    async def until(self, run_ids: list[str], states: set[RunState]) -> list[Run]:
        """Wait for every run of ``run_ids`` to be in one of ``states``."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            found = [await asyncio.to_thread(self.store.get_run, i) for i in run_ids]
            if all(r is not None and r.state in states for r in found):
                return [r for r in found if r is not None]
            if time.monotonic() > deadline:
                raise RuntimeError(f"runs not {states} after {DEADLINE_S} s: {found}")
            await asyncio.sleep(POLL_S)


@asynccontextmanager
async def fleet(backend: str, concurrency: int) -> AsyncIterator[Fleet]:
    with (
        fresh_database(backend) as db,
        running(OPENAI_PATH) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        store = Store(db.url)
        upgrade(store.engine)
        settings = Settings(database_url=db.url, max_limits=CAP)

        def engine(agent: Agent) -> Engine:
            # Its model is never called: this process only creates runs.
            return Engine(
                agent=agent, model=bench_agent.model(), settings=settings, notifier=MemoryNotifier()
            )

        env = throughput.worker_env(db.url)
        env.update(
            TETHER_MODEL="openai:bench",
            OPENAI_BASE_URL=f"{server.url}/v1",
            OPENAI_API_KEY="sk-bench",
        )
        command = [
            sys.executable, "-m", "tether", "worker", "--no-reap",
            "--concurrency", str(concurrency), "--agent", "bench_agent:tree_agent",
        ]  # fmt: skip
        workers = throughput.start_workers(command, env, tmp, 2)
        the_fleet = Fleet(
            db=db,
            server=server,
            store=store,
            lead=engine(bench_agent.tree_agent()),
            helper=engine(bench_agent.helper_agent()),
        )
        try:
            await warm_up(the_fleet, workers, tmp)
            yield the_fleet
        finally:
            for proc in workers:
                proc.terminate()
            for proc in workers:
                proc.wait(timeout=60)
            await the_fleet.lead.aclose()
            await the_fleet.helper.aclose()
            store.close()


async def warm_up(f: Fleet, workers: list[subprocess.Popen[bytes]], tmp: str) -> None:
    """A small tree and two top-level runs, untimed: both workers up, their code warm."""
    f.server.script_for(LEAD_PROMPT, delegating(["warm 0", "warm 1"]), done())
    f.server.script_for(HELPER_PROMPT, *(done() for _ in range(4)))
    runs = [(await f.lead.start_run(USER, "warm up", limits=ROOMY)).id]
    for i in range(2):
        runs.append((await f.helper.start_run(USER, f"warm {i}", limits=ROOMY)).id)
    try:
        await f.until(runs, {RunState.ANSWERED})
    except RuntimeError:
        logs = "\n".join(p.read_text()[-1500:] for p in Path(tmp).glob("w*.log"))
        dead = [w.returncode for w in workers if w.poll() is not None]
        raise RuntimeError(f"warm-up failed (workers exited: {dead}):\n{logs}") from None


# -- 1. fan-out ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FanOut:
    total: float  # from the lead's turn (or the first creation) to the 50th first request
    created: float  # from the last child's (or top-level run's) creation to it


async def tree_round(f: Fleet, children: int) -> FanOut:
    tasks = [f"task {i}" for i in range(children)]
    f.server.script_for(LEAD_PROMPT, delegating(tasks), done())
    f.server.script_for(HELPER_PROMPT, *(done() for _ in tasks))
    mark = f.server.count()
    root = await f.lead.start_run(USER, "fan out", limits=ROOMY)
    await f.until([root.id], {RunState.ANSWERED})
    firsts = first_requests(f.requests(mark, HELPER_PROMPT), tasks)
    turn = f.event_at(root.id, "model_turn")
    kids = f.store.children(root.id)
    stored = max(f.event_at(kid.id, "created") for kid in kids)
    return FanOut(total=max(firsts) - turn, created=max(firsts) - stored)


async def top_level_round(f: Fleet, count: int) -> FanOut:
    tasks = [f"task {i}" for i in range(count)]
    f.server.script_for(HELPER_PROMPT, *(done() for _ in tasks))
    mark = f.server.count()
    made = [await f.helper.start_run(USER, t, limits=ROOMY) for t in tasks]
    await f.until([r.id for r in made], {RunState.ANSWERED})
    firsts = first_requests(f.requests(mark, HELPER_PROMPT), tasks)
    created = [f.event_at(r.id, "created") for r in made]
    return FanOut(total=max(firsts) - min(created), created=max(firsts) - max(created))


def first_requests(requests: list[tuple[float, str]], tasks: list[str]) -> list[float]:
    """The arrival of each task's first model request."""
    first: dict[str, float] = {}
    for at, task in requests:
        first.setdefault(task, at)
    missing = set(tasks) - set(first)
    if missing:
        raise RuntimeError(f"no model request for {len(missing)} tasks")
    return [first[t] for t in tasks]


async def fanout(f: Fleet, children: int, rounds: int) -> None:
    trees: list[FanOut] = []
    tops: list[FanOut] = []
    for i in range(rounds):  # alternating which goes first
        if i % 2 == 0:
            trees.append(await tree_round(f, children))
            tops.append(await top_level_round(f, children))
        else:
            tops.append(await top_level_round(f, children))
            trees.append(await tree_round(f, children))
    tree = statistics.median(t.total for t in trees)
    top = statistics.median(t.total for t in tops)
    print(f"  fan-out of {children}, ms to the {children}th first model request (median):")
    print(
        f"    tree: from the lead's turn      {ms(tree)}   (from the last child's creation "
        f"{ms(statistics.median(t.created for t in trees)).strip()}; rounds "
        f"{', '.join(ms(t.total).strip() for t in trees)})"
    )
    print(
        f"    top-level: from the first made  {ms(top)}   (from the last one's creation "
        f"{ms(statistics.median(t.created for t in tops)).strip()}; rounds "
        f"{', '.join(ms(t.total).strip() for t in tops)})"
    )
    ratio = tree / top
    after = statistics.median(t.created for t in trees) / statistics.median(t.created for t in tops)
    print(
        f"    tree / top-level                {ratio:8.2f}   (<= {GOAL_FANOUT}: "
        f"{verdict(ratio, GOAL_FANOUT)}; from the creations: {after:.2f})"
    )


# -- 2. wake -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """One tree of one child, timed (s)."""

    wake: float  # the child's answer to the lead's next model request
    stored: float  # the child's answer to its result stored in the lead (``tool_result``)
    created: float  # the lead's creation to its first model request


async def one_tree(f: Fleet) -> Tree:
    """One tree of one child, carried and timed."""
    f.server.script_for(LEAD_PROMPT, delegating(["task 0"]), done())
    f.server.script_for(HELPER_PROMPT, done())
    mark = f.server.count()
    root = await f.lead.start_run(USER, "delegate once", limits=ROOMY)
    await f.until([root.id], {RunState.ANSWERED})
    (child,) = f.store.children(root.id)
    lead = f.requests(mark, LEAD_PROMPT)
    if len(lead) != 2:
        raise RuntimeError(f"the lead made {len(lead)} model requests, not 2")
    answered = f.event_at(child.id, "answered")
    return Tree(
        wake=lead[1][0] - answered,
        stored=f.event_at(root.id, "tool_result") - answered,
        created=lead[0][0] - f.event_at(root.id, "created"),
    )


async def one_continued(f: Fleet) -> float:
    """From the ``continued`` event of a run halted by its ``max_steps`` to its next
    model request."""
    f.server.script_for(LEAD_PROMPT, fetching(), done())
    mark = f.server.count()
    limits = {"max_steps": 1, "max_tool_calls": 10}
    run = await f.lead.start_run(USER, "halt once", limits=limits)
    await f.until([run.id], {RunState.HALTED})
    await f.lead.continue_run(run.id, USER)
    await f.until([run.id], {RunState.ANSWERED})
    lead = f.requests(mark, LEAD_PROMPT)
    if len(lead) != 2:
        raise RuntimeError(f"the continued run made {len(lead)} model requests, not 2")
    return lead[1][0] - f.event_at(run.id, "continued")


async def wake(f: Fleet, trees: int) -> None:
    timed: list[Tree] = []
    continued: list[float] = []
    for _ in range(trees):  # one after another, alternating with the baseline
        timed.append(await one_tree(f))
        continued.append(await one_continued(f))
    wakes = [t.wake for t in timed]
    print(f"  wake, over {trees} trees of one child (ms):          p50       p99")
    rows = [
        ("child answered -> lead's next request", wakes),
        ("  of which to the child's result stored", [t.stored for t in timed]),
        ("continued -> its next request", continued),
        ("created -> first request (new run)", [t.created for t in timed]),
    ]
    for label, values in rows:
        print(f"    {label:<42} {ms(statistics.median(values))}  {ms(p99(values))}")
    extra = statistics.median(wakes) - statistics.median(continued)
    poll = 0.25 if f.db.backend == "sqlite" else 5.0
    print(
        f"    wake - continued (p50) {ms(extra).strip()} ms; wake p99 under the poll interval "
        f"({poll:g} s): {'PASS' if p99(wakes) < poll else 'MISS'}"
    )


# -- 3. the tree's budget, in process ------------------------------------------------------

CHIEF_PROMPT = "You are the chief: hand the job to a manager."
MANAGER_PROMPT = "You manage: hand the job to a worker."
BOSS_PROMPT = "You are the boss: hand each part to a worker."
WORKER_PROMPT = "You work: fetch what the task needs."


class Stamped(Model):
    """``ScriptedModel`` that stamps each request: (its system message, the run's
    question, ``time.perf_counter()``)."""

    name = "stamped"

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.stamps: list[tuple[str, str, float]] = []

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        system, question = str(messages[0]["content"]), str(messages[1]["content"])
        self.stamps.append((system, question, time.perf_counter()))
        return await self.model.request(messages, tools)

    def steps_of(self, question: str, system: str = WORKER_PROMPT) -> list[float]:
        """The seconds of each step of the run asked ``question``: request to request."""
        times = [at for s, q, at in self.stamps if q == question and s.startswith(system)]
        return [b - a for a, b in pairwise(times)]


def budget_agents() -> tuple[Agent, Agent, Agent]:
    """(the chief, over a manager, over a worker: depth 2), (the boss, over workers), the
    worker agent itself."""
    worker = Agent(name="worker", system_prompt=WORKER_PROMPT, tools=(bench_agent.fetch,))
    manager = Agent(name="manager", system_prompt=MANAGER_PROMPT, tools=(worker.as_tool(),))
    chief = Agent(name="chief", system_prompt=CHIEF_PROMPT, tools=(manager.as_tool(),))
    boss = Agent(name="boss", system_prompt=BOSS_PROMPT, tools=(worker.as_tool(),))
    return chief, boss, worker


def budget_model(steps: int, parts: int) -> Stamped:
    def call(name: str, task: str) -> dict[str, Any]:
        return {"name": name, "arguments": {"task": task}}

    work = [{"tool_calls": [{"name": "fetch", "arguments": {"n": i}}]} for i in range(steps - 1)]
    return Stamped(
        ScriptedModel(
            [],
            by_system={
                CHIEF_PROMPT: {"turns": [{"tool_calls": [call("manager", "job")]}]},
                MANAGER_PROMPT: {"turns": [{"tool_calls": [call("worker", "job")]}]},
                BOSS_PROMPT: {
                    "turns": [{"tool_calls": [call("worker", f"part {i}") for i in range(parts)]}]
                },
                WORKER_PROMPT: {"turns": [*work, {"content": "done"}]},
            },
        )
    )


@dataclass(frozen=True)
class Steps:
    median: float  # the median step of the runs timed (s)
    window: float  # first request to last, over the steps taken (s per step)
    cpu: float  # this process's CPU (every thread) while they were carried, per step (s)


async def depth_two(chief: Engine, model: Stamped) -> Steps:
    root = await chief.start_run(USER, "job", limits=ROOMY)
    await chief.run_until_stop(root.id)  # waiting for its manager
    (manager,) = chief.runner.store.children(root.id)
    await chief.run_until_stop(manager.id)  # waiting for its worker
    (worker,) = chief.runner.store.children(manager.id)
    if worker.depth != 2:
        raise RuntimeError(f"the worker run is at depth {worker.depth}")
    model.stamps.clear()
    cpu = time.process_time()
    await chief.run_until_stop(worker.id)
    cpu = time.process_time() - cpu
    steps = model.steps_of("job")
    await chief.run_until_stop(manager.id)
    await chief.run_until_stop(root.id)
    return Steps(statistics.median(steps), sum(steps) / len(steps), cpu / len(steps))


async def top_level(alone: Engine, model: Stamped) -> Steps:
    run = await alone.start_run(USER, "job", limits=ROOMY)
    model.stamps.clear()
    cpu = time.process_time()
    await alone.run_until_stop(run.id)
    cpu = time.process_time() - cpu
    steps = model.steps_of("job")
    return Steps(statistics.median(steps), sum(steps) / len(steps), cpu / len(steps))


async def eight_children(boss: Engine, model: Stamped, parts: int) -> Steps:
    root = await boss.start_run(USER, "parts", limits=ROOMY)
    await boss.run_until_stop(root.id)  # waiting for its children
    model.stamps.clear()
    cpu = time.process_time()
    # The root's wake and last step come after its children's steps, timed with them.
    await Worker(boss, concurrency=parts).run(exit_when_idle=True, reap=False)
    return spread(model, parts, time.process_time() - cpu)


async def eight_top_level(alone: Engine, model: Stamped, parts: int) -> Steps:
    for i in range(parts):
        await alone.start_run(USER, f"part {i}", limits=ROOMY)
    model.stamps.clear()
    cpu = time.process_time()
    await Worker(alone, concurrency=parts).run(exit_when_idle=True, reap=False)
    return spread(model, parts, time.process_time() - cpu)


def spread(model: Stamped, parts: int, cpu: float) -> Steps:
    """The steps of the ``parts`` runs stepping at once: the median step of all, the
    window from the first request to the last per step taken, and ``cpu`` per step."""
    steps = [s for i in range(parts) for s in model.steps_of(f"part {i}")]
    times = [at for s, _, at in model.stamps if s.startswith(WORKER_PROMPT)]
    n = len(steps)
    return Steps(statistics.median(steps), (max(times) - min(times)) / n, cpu / n)


async def budget(backend: str, steps: int, parts: int, pairs_of: int, repeat: int) -> None:
    with fresh_database(backend) as db:
        store = Store(db.url)
        upgrade(store.engine)
        store.close()
        settings = Settings(database_url=db.url, max_limits=CAP)
        chief_agent, boss_agent, worker_agent = budget_agents()
        model = budget_model(steps, parts)

        def engine(agent: Agent) -> Engine:
            return Engine(agent=agent, model=model, settings=settings, notifier=MemoryNotifier())

        chief, boss, alone = engine(chief_agent), engine(boss_agent), engine(worker_agent)
        try:
            pairs: list[tuple[Steps, Steps]] = []
            eights: list[tuple[Steps, Steps]] = []
            await top_level(alone, model)  # warm
            for i in range(max(pairs_of, repeat)):
                if i < pairs_of:
                    first, second = depth_two(chief, model), top_level(alone, model)
                    pairs.append(await ordered(i, first, second))
                if i < repeat:
                    first, second = (
                        eight_children(boss, model, parts),
                        eight_top_level(alone, model, parts),
                    )
                    eights.append(await ordered(i, first, second))
        finally:
            for e in (chief, boss, alone):
                await e.aclose()
    print(
        f"  the tree's budget, ms per step of {steps}-step runs ({pairs_of} pairs of one run, "
        f"{repeat} of {parts} runs):"
    )
    print(
        "                               median: tree  top-level  ratio"
        "       fastest: tree  top-level  ratio"
    )
    report("a run at depth 2", pairs, lambda s: s.median)
    report("  its CPU", pairs, lambda s: s.cpu)
    report(f"{parts} children at once", eights, lambda s: s.median)
    report("  the window", eights, lambda s: s.window)
    report("  their CPU", eights, lambda s: s.cpu)


async def ordered(i: int, tree: Awaitable[Steps], top: Awaitable[Steps]) -> tuple[Steps, Steps]:
    """Both measures, the tree's first on even repeats, the top-level's on odd ones."""
    if i % 2 == 0:
        a = await tree
        return a, await top
    b = await top
    return await tree, b


def report(label: str, pairs: list[tuple[Steps, Steps]], of: Callable[[Steps], float]) -> None:
    """The tree's figure against the top-level runs', median and fastest of the repeats;
    the verdict on the medians."""
    tree = statistics.median(of(t) for t, _ in pairs)
    top = statistics.median(of(b) for _, b in pairs)
    fast_tree, fast_top = min(of(t) for t, _ in pairs), min(of(b) for _, b in pairs)
    ratio = tree / top
    print(
        f"    {label:<24} {ms(tree)}   {ms(top)}  {ratio:5.2f} {verdict(ratio, GOAL_BUDGET)}"
        f"         {ms(fast_tree)}   {ms(fast_top)}  {fast_tree / fast_top:5.2f}"
    )


# -- main ----------------------------------------------------------------------------------


@contextmanager
def heading(part: str, backend: str) -> Iterator[None]:
    load = os.getloadavg()
    began = time.monotonic()
    print(f"{backend} {part} (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)
    yield
    print(f"  ({time.monotonic() - began:.0f} s)", flush=True)


async def main_async(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    for backend in args.backends.split(","):
        if only & {"fanout", "wake"}:
            with heading("workers", backend):
                async with fleet(backend, args.concurrency) as f:
                    if "fanout" in only:
                        await fanout(f, args.children, args.rounds)
                    if "wake" in only:
                        await wake(f, args.trees)
        if "budget" in only:
            with heading("budget", backend):
                await budget(backend, args.steps, args.parts, args.pairs, args.repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="fanout,wake,budget")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--children", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
