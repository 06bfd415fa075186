"""The agent the benchmarks' worker processes load (``--agent bench_agent:agent``):
a read tool, a confirmation tool, and a scripted model chosen by ``BENCH_SCRIPT``; one
whose model writes timed text (``--agent bench_agent:text_agent``, for ``deltas.py``); and
one whose confirmed call is escalated (``--agent bench_agent:escalating_agent``, for
``escalations.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from tether import Agent, Scope, ScriptedModel, ToolContext, tool
from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec, Usage


@tool
def fetch(n: int) -> dict[str, Any]:
    """Fetch item n (a read)."""
    return {"n": n, "body": "x" * 512}


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"item": args.item}


@tool(effect="write", needs_confirmation=True, dedupes=True, preview=_preview)
def publish(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Publish an item (a write a human confirms)."""
    return {"published": item, "key": ctx.idempotency_key}


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    preview=_preview,
    escalate_after_min=20,
    escalate_to=("group:oncall", "lead"),
)
def page(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Page someone (a write a human confirms, escalated after 20 minutes undecided)."""
    return {"paged": item, "key": ctx.idempotency_key}


def steps(count: int) -> list[dict[str, Any]]:
    """``count`` model turns: count - 1 tool turns, then the answer."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "fetch", "arguments": {"n": i}}]} for i in range(count - 1)
    ]
    return [*turns, {"content": "done"}]


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "ten": steps(10),
    "publish": [
        {"tool_calls": [{"name": "publish", "arguments": {"item": "a"}}]},
        {"content": "ok"},
    ],
    "page": [
        {"tool_calls": [{"name": "page", "arguments": {"item": "a"}}]},
        {"content": "ok"},
    ],
}


def model() -> ScriptedModel:
    return ScriptedModel(SCRIPTS[os.environ.get("BENCH_SCRIPT", "ten")])


def agent() -> Agent:
    return Agent(name="bench", system_prompt="bench", tools=(fetch, publish), default_model=model)


def escalating_agent() -> Agent:
    """The benchmark agent whose ``page`` calls are escalated (``BENCH_SCRIPT=page``)."""
    return Agent(name="bench", system_prompt="bench", tools=(fetch, page), default_model=model)


class TimedText(Model):
    """10 turns (9 ``fetch`` calls, then the answer), each writing ``BENCH_PIECES`` pieces
    of text; each piece starts with the wall-clock time it was written (``%.6f``), ends
    with ``;`` and is ``BENCH_PIECE_CHARS`` long, so a watcher can tell each piece's lag
    from the model to itself. ``BENCH_DELAY_S`` before each piece (0: a bare yield, the
    pieces as fast as the process takes them); ``BENCH_STREAM=0`` writes the turn's text
    in one piece once it is whole, as a model that cannot stream does."""

    name = "timed-text"

    def __init__(self) -> None:
        self.pieces = int(os.environ.get("BENCH_PIECES", "20"))
        self.chars = int(os.environ.get("BENCH_PIECE_CHARS", "24"))
        self.delay_s = float(os.environ.get("BENCH_DELAY_S", "0"))
        self.streams = os.environ.get("BENCH_STREAM", "1") != "0"

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        return await self.stream(messages, tools, lambda piece: None)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        index = sum(1 for m in messages if m.get("role") == "assistant")
        parts = []
        for _ in range(self.pieces):
            await asyncio.sleep(self.delay_s)
            piece = f"{time.time():.6f}".ljust(self.chars - 1, ".") + ";"
            parts.append(piece)
            if self.streams:
                on_text(piece)
        text = "".join(parts)
        if not self.streams:
            on_text(text)
        message: Message = {"role": "assistant", "content": text}
        if index < 9:
            call = {"name": "fetch", "arguments": json.dumps({"n": index})}
            message["tool_calls"] = [{"id": f"c{index}", "type": "function", "function": call}]
        return ModelResponse(message=message, usage=Usage(input_tokens=100), model="timed")


def text_agent() -> Agent:
    """The benchmark agent on ``TimedText`` (``--agent bench_agent:text_agent``)."""
    return Agent(name="bench", system_prompt="bench", tools=(fetch,), default_model=TimedText)


def counted_agent() -> Agent:
    """``agent`` in a worker that counts its model-rate lease transactions
    (``Store.lease_capacity``) and writes the count to ``BENCH_LEASES_FILE`` at exit (for
    ``rate_limit.py``)."""
    import atexit

    from tether.store import Store

    if hasattr(Store.lease_capacity, "counted"):
        return agent()  # counted already
    counted = {"leases": 0}
    lease = Store.lease_capacity

    def counting(self: Store, **kwargs: Any) -> Any:
        counted["leases"] += 1
        return lease(self, **kwargs)

    counting.counted = counted  # type: ignore[attr-defined]
    Store.lease_capacity = counting  # type: ignore[method-assign,assignment]
    path = os.environ["BENCH_LEASES_FILE"]
    atexit.register(lambda: open(path, "w").write(json.dumps(counted)))
    return agent()


class LagMonitor:
    """The event loop's lag, sampled by a task that asks to wake every ``PERIOD_S``: each
    wake-up's delay past its due time, written each second as a JSON line (the second's
    samples, in ms) to ``BENCH_LAG_FILE``, with the process's CPU seconds, for
    ``capacity.py``."""

    PERIOD_S = 0.01

    def __init__(self, path: str) -> None:
        self.path = path
        self.task: asyncio.Task[None] | None = None
        # The garbage collector's pauses (ms) by generation, since the last line.
        self.gc_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._gc_began = 0.0
        self.collected = 0  # cyclic garbage the collector freed, since the last line

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc_ms[info["generation"]].append((time.perf_counter() - self._gc_began) * 1000)
            self.collected += info["collected"]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        samples: list[float] = []
        flushed = loop.time()
        import gc

        gc.callbacks.append(self._on_gc)
        # Several processes (``tether worker --processes``) append to one file: each line
        # is one write(2) to a file opened O_APPEND, so lines never interleave.
        out = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while True:
                due = loop.time() + self.PERIOD_S
                await asyncio.sleep(self.PERIOD_S)
                now = loop.time()
                samples.append(max(0.0, now - due) * 1000)
                if now - flushed >= 1.0:
                    line = {"at": time.time(), "lag_ms": samples, "gc_ms": self.gc_ms}
                    line["pid"] = os.getpid()
                    line["collected"] = self.collected
                    self.collected = 0
                    if os.environ.get("BENCH_COUNT_OBJECTS"):
                        line["objects"] = len(gc.get_objects())
                        line["by_gen"] = [len(gc.get_objects(g)) for g in range(3)]
                        line["frozen"] = gc.get_freeze_count()
                    os.write(out, (json.dumps(line) + "\n").encode())
                    samples, flushed = [], now
                    self.gc_ms = {0: [], 1: [], 2: []}
        finally:
            os.close(out)


def capacity_agent() -> Agent:
    """The agent of ``capacity.py``'s worker: the read tool ``fetch`` (a plain function,
    as most tools are written) and the model ``TETHER_MODEL`` names (the fake OpenAI
    server); with ``BENCH_LAG_FILE`` set, the event loop's lag is sampled while it serves."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(agent: Agent) -> Any:
        path = os.environ.get("BENCH_LAG_FILE")
        monitor = LagMonitor(path) if path else None
        task = asyncio.create_task(monitor.run()) if monitor else None
        try:
            yield agent
        finally:
            if task is not None:
                task.cancel()

    return Agent(name="capacity", system_prompt="bench", tools=(fetch,), lifespan=lifespan)


class LoopOrAnswer(Model):
    """The question ``loop`` asks for ``fetch`` turn after turn (up to 500), any other is
    answered at once; each request takes ``BENCH_MODEL_S`` (0.14 s), for ``rate_turns.py``:
    one user's looping run against another's one-step run."""

    name = "loop-or-answer"

    def __init__(self) -> None:
        self.latency_s = float(os.environ.get("BENCH_MODEL_S", "0.14"))

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        await asyncio.sleep(self.latency_s)
        index = sum(1 for m in messages if m.get("role") == "assistant")
        message: Message = {"role": "assistant", "content": "done"}
        if messages[1].get("content") == "loop" and index < 500:
            call = {"name": "fetch", "arguments": json.dumps({"n": index})}
            message = {"role": "assistant", "content": None}
            message["tool_calls"] = [{"id": f"c{index}", "type": "function", "function": call}]
        return ModelResponse(message=message, usage=Usage(input_tokens=10), model="loop")


def loop_agent() -> Agent:
    """The benchmark agent on ``LoopOrAnswer`` (``--agent bench_agent:loop_agent``)."""
    return Agent(name="bench", system_prompt="bench", tools=(fetch,), default_model=LoopOrAnswer)


# The tree of ``trees.py``'s workers: a lead that delegates to helpers. The fake model
# answers each agent by the start of its system prompt (``FakeLLMServer.script_for``).
LEAD_PROMPT = "You lead: hand each task to a helper."
HELPER_PROMPT = "You help: do the task you are given."


def helper_agent() -> Agent:
    """The sub-agent of ``tree_agent``, on the model ``TETHER_MODEL`` names; its
    top-level runs are carried by the same workers (``trees.py``'s baseline)."""
    return Agent(name="helper", system_prompt=HELPER_PROMPT, tools=(fetch,))


def tree_agent() -> Agent:
    """A lead with the sub-agent ``helper`` and the read tool ``fetch``, on the model
    ``TETHER_MODEL`` names (``--agent bench_agent:tree_agent``, for ``trees.py``)."""
    helper = helper_agent().as_tool(description="Hand a task to a helper.")
    return Agent(name="lead", system_prompt=LEAD_PROMPT, tools=(helper, fetch))
