"""The demo story (reference §8), told with real runs, a real sandbox CRM and a scripted model.

Five scenes on a fresh SQLite database in a temporary folder, each returning what it
expected and what the store and the sandbox actually recorded; ``main`` prints them as a
summary and returns 1 if any scene differs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from tether.demo.render import summary_table
from tether.demo.scenes import (
    scene_budget,
    scene_crash,
    scene_double_approval,
    scene_stale_approval,
    scene_suspend,
)
from tether.demo.stage import SceneResult, Stage, open_stage
from tether.telemetry.logs import configure

# -- the story ---------------------------------------------------------------------------------

Scene = Callable[[Stage], Awaitable[SceneResult]]


async def play(stage: Stage) -> list[SceneResult]:
    """Every scene in order, each under its heading; a scene that raises is reported as
    failed with its error, and the story goes on."""
    headings = [
        "1. dana asks for a quote; the send waits for confirmation",
        "2. the approval is clicked twice at once",
        "3. a worker dies after the quote commits",
        "4. a run hits its budget; its owner continues it",
        "5. the failure mode: the world changes while a send waits",
    ]
    results: list[SceneResult] = []
    first = await _scene(stage, headings[0], 1, scene_suspend)
    results.append(first)

    async def approve_twice(s: Stage) -> SceneResult:
        if first.run_id is None:
            raise RuntimeError("scene 1 did not start a run")
        return await scene_double_approval(s, first.run_id)

    scenes: list[Scene] = [approve_twice, scene_crash, scene_budget, scene_stale_approval]
    for number, (heading, scene) in enumerate(zip(headings[1:], scenes, strict=True), 2):
        results.append(await _scene(stage, heading, number, scene))
    return results


async def _scene(stage: Stage, heading: str, number: int, scene: Scene) -> SceneResult:
    """One scene under its heading; an exception is the scene's failure, not the story's."""
    stage.console.rule(f"[bold cyan]Scene {heading}")
    try:
        return await scene(stage)
    except Exception as exc:
        stage.console.print(f"[red]the scene failed: {escape(repr(exc))}[/red]")
        return SceneResult(
            number=number,
            title=heading.split(". ", 1)[1],
            expected={"completed": True},
            observed={"error": repr(exc)},
        )


async def _tell(console: Console) -> list[SceneResult]:
    async with open_stage(console) as stage:
        return await play(stage)


def main() -> int:
    """Run the demo; 0 when every scene matched its expectation."""
    configure("WARNING")
    console = Console()
    started = time.monotonic()
    console.print(
        Panel(
            "tether: agent runs that survive interruption.\n"
            "A sales assistant drafts and sends quotes in a stand-in CRM (the sandbox), "
            "with a scripted model, on a fresh SQLite database.",
            title="tether demo",
        )
    )
    results = asyncio.run(_tell(console))
    console.rule("[bold cyan]Summary")
    console.print(summary_table(results))
    console.print(
        "Watch a run live: `tether serve`, then GET /v1/runs/RUN_ID/events/stream "
        "(Server-Sent Events) or `tether runs watch RUN_ID` (docs/integrations.md)."
    )
    failed = [r for r in results if not r.ok]
    elapsed = time.monotonic() - started
    if failed:
        console.print(f"[red]{len(failed)} scene(s) differ from what was expected[/red]")
        return 1
    console.print(f"[green]every scene went as expected[/green] ({elapsed:.1f} s)")
    return 0
