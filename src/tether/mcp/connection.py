"""Connecting to MCP servers for as long as a process serves an agent.

``connect(*servers)`` opens one SDK client per server (a stdio subprocess, or a
streamable HTTP URL), lists its tools and yields them as tether tools; the clients stay
open inside the ``async with`` and close after it. ``serving(*servers)`` is the agent's
``lifespan`` built on it: every process that calls tools or reconciles them (``serve``,
``worker``, ``demo``, ``approve``, ``reap``) enters it and serves the agent with the MCP
tools added.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tether.errors import ConfigError
from tether.mcp.link import Link
from tether.mcp.mapping import Override, build, check_overrides
from tether.tools.tool import Tool, UnsafeTool

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client._transport import TransportStreams
    from mcp_types import Tool as McpTool

    from tether.agent import Agent

log = logging.getLogger(__name__)
# Pages of tools/list read at most from one server (a paginator that never ends).
MAX_PAGES = 100


@dataclass(frozen=True, kw_only=True)
class StdioServer:
    """An MCP server run as a subprocess of this process, spoken to over its stdin and
    stdout. ``prefix`` goes before each of its tool names (to tell servers apart)."""

    command: str
    args: Sequence[str] = ()
    # Over the SDK's safe default environment (PATH, HOME, ...): the server gets no other
    # variable of this process unless named here.
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    prefix: str = ""

    def label(self) -> str:
        return " ".join([self.command, *self.args])

    def client(self) -> Client:
        from mcp import Client, StdioServerParameters

        params = StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=None if self.env is None else dict(self.env),
            cwd=self.cwd,
        )
        return Client(params)


@dataclass(frozen=True, kw_only=True)
class HttpServer:
    """An MCP server at a streamable HTTP ``url`` (e.g. ``http://127.0.0.1:8000/mcp``),
    sent ``headers`` with every request (``{"Authorization": "Bearer ..."}``)."""

    url: str
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    prefix: str = ""

    def label(self) -> str:
        return self.url

    def client(self) -> Client:
        from mcp import Client

        if not self.headers:
            return Client(self.url)
        return Client(_with_headers(self.url, dict(self.headers)))


@asynccontextmanager
async def _with_headers(url: str, headers: dict[str, str]) -> AsyncIterator[TransportStreams]:
    """The SDK's streamable HTTP transport on an HTTP client of its own that sends
    ``headers`` (with the SDK's default timeouts), closed with the transport."""
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's own factory (its session groups use it too): its timeouts fit a stream.
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


Server = StdioServer | HttpServer


@asynccontextmanager
async def connect(
    *servers: Server, overrides: Mapping[str, Override] | None = None
) -> AsyncIterator[tuple[Tool, ...]]:
    """The tools of ``servers`` as tether tools, their connections open until the block
    ends. ``overrides`` maps a tool's tether name (prefix included) to what it declares
    beyond its annotations. A server that cannot be reached, an override naming no tool,
    two tools with one name, or an unsafe write is a ``ConfigError`` before any tool is
    yielded."""
    overrides = dict(overrides or {})
    async with AsyncExitStack() as stack:
        listed: dict[str, tuple[Link, McpTool]] = {}
        for server in servers:
            link = Link(server)
            stack.push_async_callback(link.close)
            client = await link.open()
            for source in await _list(client, server):
                name = server.prefix + source.name
                if name in listed:
                    raise ConfigError(
                        f"two MCP tools are called {name!r} (the second from "
                        f"{server.label()}): give a server a prefix"
                    )
                listed[name] = (link, source)
        check_overrides(listed, overrides)
        yield _build_all(listed, overrides)


def serving(
    *servers: Server, overrides: Mapping[str, Override] | None = None
) -> Callable[[Agent], AbstractAsyncContextManager[Agent]]:
    """An agent ``lifespan``: connect to ``servers`` and serve the agent with their tools
    added after its own (``connect``), for as long as the process serves it."""

    @asynccontextmanager
    async def lifespan(agent: Agent) -> AsyncIterator[Agent]:
        async with connect(*servers, overrides=overrides) as tools:
            log.info(
                "MCP tools connected",
                extra={"action": "mcp_connect", "tools": [t.name for t in tools]},
            )
            yield replace(agent, tools=(*agent.tools, *tools))

    return lifespan


async def _list(client: Client, server: Server) -> list[McpTool]:
    """Every tool the server lists, page after page."""
    tools: list[McpTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise ConfigError(f"the MCP server {server.label()} lists more than {MAX_PAGES} pages")


def _build_all(
    listed: Mapping[str, tuple[Link, McpTool]], overrides: Mapping[str, Override]
) -> tuple[Tool, ...]:
    """Every listed tool as a tether tool; every unsafe one named in one error."""
    tools: list[Tool] = []
    unsafe: list[str] = []
    for name, (link, source) in listed.items():
        try:
            tools.append(build(link, source, name, overrides.get(name, {})))
        except UnsafeTool as exc:
            unsafe.append(exc.message)
    if unsafe:
        raise UnsafeTool("\n".join(unsafe))
    return tuple(tools)
