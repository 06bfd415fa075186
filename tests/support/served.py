"""The HTTP app on a loopback port, served by a real uvicorn on the test's event loop, with
an in-process engine for the test agent (``inprocess.engine``) and two users."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import inprocess
import uvicorn
from waiting import until

from tether import Engine
from tether.api.app import create_app

KEYS = {"dana": "key-of-dana", "miguel": "key-of-miguel"}
DANA = {"Authorization": f"Bearer {KEYS['dana']}"}
DEADLINE_S = 30.0


@dataclass
class Served:
    engine: Engine
    base: str
    app: Any = None  # the FastAPI app served


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serving(
    url: str, *, script_name: str = "standard", **settings: Any
) -> AsyncIterator[Served]:
    """The app on a loopback port, served by uvicorn on this test's event loop."""
    engine = inprocess.engine(url, script_name=script_name, **settings)
    for user, key in KEYS.items():
        await engine.operator.add_user(user, key)
    port = free_port()
    app = create_app(engine)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        ws="none",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started, timeout=DEADLINE_S, what="uvicorn to start")
        yield Served(engine=engine, base=f"http://127.0.0.1:{port}", app=app)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, DEADLINE_S)
        engine.close()
