"""The agent the benchmarks' worker processes load (``--agent bench_agent:agent``):
a read tool, a confirmation tool, and a scripted model chosen by ``BENCH_SCRIPT``."""

from __future__ import annotations

import os
from typing import Any

from tether import Agent, Scope, ScriptedModel, ToolContext, tool


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
}


def model() -> ScriptedModel:
    return ScriptedModel(SCRIPTS[os.environ.get("BENCH_SCRIPT", "ten")])


def agent() -> Agent:
    return Agent(name="bench", system_prompt="bench", tools=(fetch, publish), default_model=model)
