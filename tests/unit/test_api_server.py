"""``tether serve``'s uvicorn (``tether.api.server.server_config``) on a loopback port of
its own: ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed only from the proxies
``TETHER_TRUSTED_PROXIES`` lists, never by default (uvicorn's own default believes
127.0.0.1, so any local client could name the address its failures count against)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from waiting import until

from tether.api.server import AcceptErrors, server_config
from tether.config import Settings

FORWARDED = {"X-Forwarded-For": "203.0.113.9, 198.51.100.7", "X-Forwarded-Proto": "https"}


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """The client and scheme the app is handed, as JSON."""
    if scope["type"] != "http":
        return
    client = scope.get("client") or ("", 0)
    body = json.dumps({"client": client[0], "scheme": scope["scheme"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = server_config(echo, "127.0.0.1", port, settings)
    config.lifespan = "off"
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started, timeout=30, what="uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def seen(settings: Settings) -> dict[str, str]:
    async with served(settings) as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.get("/", headers=FORWARDED)
        body: dict[str, str] = response.json()
        return body


async def test_forwarding_headers_from_loopback_are_not_believed_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")  # uvicorn's own variable is not read
    assert await seen(Settings()) == {"client": "127.0.0.1", "scheme": "http"}


async def test_a_listed_proxy_names_the_client_and_the_scheme() -> None:
    trusted = Settings(trusted_proxies=("127.0.0.1",))
    # The right-most address the proxy did not add itself is the client.
    assert await seen(trusted) == {"client": "198.51.100.7", "scheme": "https"}
    both = Settings(trusted_proxies=("127.0.0.0/8", "198.51.100.0/24"))
    assert await seen(both) == {"client": "203.0.113.9", "scheme": "https"}


async def test_a_proxy_not_listed_is_not_believed() -> None:
    elsewhere = Settings(trusted_proxies=("10.0.0.0/8",))
    assert await seen(elsewhere) == {"client": "127.0.0.1", "scheme": "http"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_accept_errors_are_one_line_per_interval_with_how_many_were_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    others: list[dict[str, object]] = []
    clock = Clock()
    handler = AcceptErrors(lambda _, context: others.append(context), clock=clock)
    loop = asyncio.new_event_loop()
    try:
        error = {"message": AcceptErrors.MESSAGE, "exception": OSError(24, "Too many open")}
        with caplog.at_level(logging.ERROR, logger="tether.api.server"):
            for _ in range(10_000):
                handler(loop, error)
            clock.now += 10
            handler(loop, error)
            handler(loop, {"message": "something else"})
    finally:
        loop.close()
    said = [r for r in caplog.records if "cannot be accepted" in r.getMessage()]
    assert [getattr(r, "held_back", None) for r in said] == [0, 9_999]
    assert others == [{"message": "something else"}]  # anything else: the previous handler


def test_the_soft_limit_of_open_files_is_raised_to_the_hard_one() -> None:
    script = (
        "import resource\n"
        "from tether.api.server import raise_file_limit\n"
        "hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(raise_file_limit() == (256, hard), resource.getrlimit(resource.RLIMIT_NOFILE)"
        " == (hard, hard))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "True"], done.stderr
