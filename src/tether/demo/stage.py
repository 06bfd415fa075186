"""The stage the demo's scenes play on: an engine on a fresh database, the demo agent served
with its sandbox CRM, the approval notices, and the CRM's admin endpoints to check the
world against."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from tether.config import Settings
from tether.demo.agent import build_agent, demo_model
from tether.demo.crm import Crm
from tether.engine import Engine
from tether.notify import MemoryNotifier

ACCOUNT = "4471"
QUESTION = "Draft and send a quote for Henderson: 200 of SKU-4411."
HEARTBEAT_TIMEOUT_S = 0.5  # short, so the reaper can take over a dead worker's run quickly
DEADLINE_S = 30.0


@dataclass(frozen=True, kw_only=True)
class SceneResult:
    """One scene: what it expected and what the store and the sandbox recorded."""

    number: int
    title: str
    expected: dict[str, Any]
    observed: dict[str, Any]
    run_id: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the scene went as expected."""
        return self.observed == self.expected


@dataclass(kw_only=True)
class Stage:
    """Everything the scenes share: the engine, its notices, the sandbox, the console."""

    console: Console
    engine: Engine
    notifier: MemoryNotifier
    settings: Settings
    sandbox_url: str
    crm: httpx.Client  # the sandbox's admin endpoints

    def new_engine(self) -> Engine:
        """Another engine on the same database, as a second process would have."""
        return Engine(
            agent=self.engine.agent,
            model=demo_model(),
            settings=self.settings,
            notifier=self.notifier,
        )

    def reset_sandbox(self) -> None:
        """Put the CRM back to its seed."""
        self.crm.post("/admin/reset").raise_for_status()

    def quotes(self) -> dict[str, Any]:
        """The sandbox's own count of Henderson's quotes: drafted, sent, and the quotes."""
        response = self.crm.get("/admin/quotes", params={"account_id": ACCOUNT})
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def quotes_of(self, run_id: str) -> list[dict[str, Any]]:
        """The quotes a run drafted: their idempotency key starts with the run's id."""
        return [q for q in self.quotes()["quotes"] if q["created_key"].startswith(f"{run_id}:")]

    def patch_account(self, **changes: Any) -> None:
        """Change Henderson in the CRM (its tier, its credit hold)."""
        self.crm.patch(f"/admin/accounts/{ACCOUNT}", json=changes).raise_for_status()


@asynccontextmanager
async def open_stage(console: Console, *, database_url: str | None = None) -> AsyncIterator[Stage]:
    """An engine on a fresh database (SQLite in a temporary folder unless ``database_url``
    is given) serving the demo agent, whose lifespan starts the sandbox CRM on a loopback
    port with its data in that folder."""
    with tempfile.TemporaryDirectory(prefix="tether-demo-") as folder:
        settings = Settings(
            database_url=database_url or f"sqlite:///{Path(folder) / 'tether.db'}",
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        )
        agent = build_agent(settings, sandbox_db=Path(folder) / "sandbox.db")
        async with agent.running() as served:
            sandbox_url = served.deps.url if isinstance(served.deps, Crm) else ""
            notifier = MemoryNotifier()
            engine = Engine(
                agent=served,
                model=demo_model(),
                settings=settings,
                notifier=notifier,
                migrate=True,
            )
            with httpx.Client(base_url=sandbox_url, timeout=10) as crm:
                async with engine:
                    yield Stage(
                        console=console,
                        engine=engine,
                        notifier=notifier,
                        settings=settings,
                        sandbox_url=sandbox_url,
                        crm=crm,
                    )
