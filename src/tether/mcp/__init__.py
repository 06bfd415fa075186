"""Tools of MCP servers as tether tools (reference §11), through the official ``mcp`` SDK.

Needs the extra ``tether[mcp]``; ``import tether`` never imports this package.
"""

from __future__ import annotations

from tether.mcp.connection import HttpServer, Server, StdioServer, connect, serving
from tether.mcp.mapping import KEY_META, Override

__all__ = ["KEY_META", "HttpServer", "Override", "Server", "StdioServer", "connect", "serving"]
