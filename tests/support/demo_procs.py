"""The demo agent in real processes, for acceptance tests that drive it over HTTP:
``tether serve`` and ``tether sandbox serve`` as subprocesses that are ready when their
URL answers, the CLI with JSON output, and the readings those tests take (a run once it
stopped, the sandbox's Henderson quote counters); and the demo's send preview as the
reference writes it, Henderson's order and a demo tool's context, for the in-process tests
of the demo agent and its sandbox too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from waiting import poll_until

from tether import Scope, ToolContext
from tether.demo.crm import Crm

DANA = {"Authorization": "Bearer tether-demo-dana"}
QUESTION = "Draft and send a quote for Henderson, 200 of SKU-4411"
STOP_S = 30
# reference §8's send preview, written out (not imported from the agent) so that a change to
# the agent cannot hide in the tests.
PREVIEW_KEYS = {
    "quote_id",
    "account_id",
    "account_name",
    "lines",
    "discount_tier",
    "discount_pct",
    "total",
}
# Henderson's order of the demo's question, as ``draft_quote``'s arguments.
ORDER = {"account_id": "4471", "sku": "SKU-4411", "quantity": 200}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def closed_url() -> str:
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


def crm_context(key: str, url: str) -> ToolContext:
    """A demo tool's context for dana's call under ``key``, its CRM at ``url``."""
    return ToolContext(
        run_id="r",
        user_id="dana",
        tool_call_id="c",
        idempotency_key=key,
        scope=Scope(user_id="dana"),
        deps=Crm(base_url=url),
    )


def demo_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ``TETHER_*``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(extra)
    return env


def _up(proc: subprocess.Popen[bytes], url: str, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path, ready_url: str) -> Iterator[None]:
    """A ``tether`` subprocess, once ``ready_url`` answers 200; stopped on the way out."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", *args],
            env=env,
            cwd=log.parent,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        poll_until(lambda: _up(proc, ready_url, log), timeout=60, what=" ".join(args))
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_S)


@contextmanager
def serving(env: dict[str, str], log: Path) -> Iterator[str]:
    """``tether serve --workers 1`` (the demo agent) until it is ready; its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with process(["serve", "--port", str(port), "--workers", "1"], env, log, f"{base}/readyz"):
        yield base


def cli(env: dict[str, str], *args: str) -> dict[str, Any]:
    """A ``tether`` command (the demo agent) that must succeed; its JSON output."""
    done = subprocess.run(
        [sys.executable, "-m", "tether", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


def stopped(base: str, run_id: str) -> dict[str, Any] | None:
    """The run with its messages once it is no longer running, else None."""
    response = httpx.get(f"{base}/v1/runs/{run_id}", headers=DANA, timeout=10)
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return None if run["state"] == "running" else run


def henderson(crm: str) -> tuple[int, int]:
    """The sandbox's (drafted, sent) quote counts of account 4471."""
    counts = httpx.get(f"{crm}/admin/quotes", params={"account_id": "4471"}, timeout=10).json()
    return int(counts["drafted"]), int(counts["sent"])
