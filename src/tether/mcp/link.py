"""One MCP server's connection, owned by a task of its own and made again when lost.

The SDK's client runs its transport in a task group bound to the task that entered it: a
transport that fails (an HTTP server gone, a stdio server that died) cancels that task.
Entered by the process's serving task, one lost MCP server would stop the worker; so each
client is entered by its own ``Link`` task, which connects again (with a backoff) when the
client fails or a call finds the connection closed. A write waits for a connected client
(its ``timeout_s`` bounds the wait with the call: a write that timed out is reconciled); a
read waits ``READ_WAIT_S`` at most, then is unavailable (tried again up to its
``retries``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from tether.errors import ConfigError
from tether.telemetry.content import kind

if TYPE_CHECKING:
    from mcp import Client

    from tether.mcp.connection import Server

log = logging.getLogger(__name__)
# A lost connection is made again after RECONNECT_FIRST_S, doubling up to RECONNECT_MAX_S.
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 5.0
# How long a read waits for a connection before it is unavailable.
READ_WAIT_S = 2.0


class Link:
    """The live client of ``server``, for every call of its tools in this process."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._client: Client | None = None
        self._connected = asyncio.Event()
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> Client:
        """Connect for the first time; a server that cannot be reached now is a
        ``ConfigError`` (the process should not start without its tools)."""
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(first), name=f"mcp {self.server.label()}")
        await first
        assert self._client is not None
        return self._client

    async def client(self, wait_s: float | None = None) -> Client | None:
        """The connected client, once there is one; None if there is none after
        ``wait_s`` seconds (None: wait as long as the caller does)."""
        try:
            async with asyncio.timeout(wait_s):
                while self._client is None:
                    await self._connected.wait()
        except TimeoutError:
            return None
        return self._client

    def lost(self, client: Client) -> None:
        """A call found ``client``'s connection closed: connect again (once per client).
        Calls from now on wait for the new connection."""
        if self._client is client:
            self._client = None
            self._connected.clear()
            self._lost.set()

    async def close(self) -> None:
        """End the connection (the owner task exits the client)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _own(self, first: asyncio.Future[None]) -> None:
        """Hold a client until it fails or is lost, then connect again after a backoff.

        Safe to repeat: a connection holds no state of a call; a call that was in flight
        when it failed answers ambiguously and is reconciled by its idempotency key."""
        delay = RECONNECT_FIRST_S
        while True:
            try:
                async with self.server.client() as client:
                    self._client, delay = client, RECONNECT_FIRST_S
                    self._lost.clear()
                    self._connected.set()
                    if not first.done():
                        first.set_result(None)
                    await self._lost.wait()
            except Exception as exc:  # the SDK's task group failed: connect again
                if not first.done():
                    first.set_exception(self._unreachable(exc))
                    return
                log.warning(
                    "MCP connection lost; connecting again",
                    extra={
                        "action": "mcp_reconnect",
                        "server": self.server.label(),
                        # Its message may quote a call's arguments: the type alone.
                        "error_type": kind(exc),
                    },
                )
            finally:
                self._client = None
                self._connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    def _unreachable(self, exc: Exception) -> ConfigError:
        error = ConfigError(
            f"cannot connect to the MCP server {self.server.label()}: {type(exc).__name__}: {exc}"
        )
        error.__cause__ = exc
        return error
