"""How ``tether serve`` runs uvicorn so that slow clients cannot hold it: a request's
headers must arrive in time (uvicorn has no such timeout: a protocol of ours adds it),
idle keep-alive connections close, and a graceful shutdown waits for requests in flight
only so long. The body's timeout is the app's (``tether.api.app.BodyLimit``). Proxy
headers are believed only from ``TETHER_TRUSTED_PROXIES``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from tether.config import Settings

log = logging.getLogger(__name__)

KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this (uvicorn's default)


class HeaderTimeoutProtocol(H11Protocol):
    """Uvicorn's h11 protocol, closing a connection whose request headers have not all
    arrived ``header_timeout_s`` after the connection opened or the request's first
    byte, with a ``408 request_timeout`` in the JSON error shape."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._awaiting_headers():
            self._disarm()
        elif self._header_timer is None:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        # No request yet on this connection, or the last one is answered and bytes of the
        # next have come (an idle connection is keep-alive's to close).
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers():
            return
        # No request was parsed, so h11 cannot frame a response: it is written as is.
        body = json.dumps(
            {
                "ok": False,
                "error": "request_timeout",
                "message": "the request headers came too slowly",
            }
        ).encode()
        head = (
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


def server_config(app: Any, host: str, port: int, settings: Settings) -> uvicorn.Config:
    """Uvicorn's configuration for ``app`` with the slow-client bounds of ``settings``."""
    protocol = type(
        "TetherHTTPProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout_s": settings.http_header_timeout_s},
    )
    if os.environ.get("FORWARDED_ALLOW_IPS"):
        log.warning(
            "FORWARDED_ALLOW_IPS is not read: serve believes X-Forwarded-For only from the "
            "proxies listed in TETHER_TRUSTED_PROXIES",
            extra={"action": "serve", "trusted_proxies": ",".join(settings.trusted_proxies)},
        )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        http=protocol,
        # tether serves no WebSocket: none is loaded, whatever else is installed beside it.
        ws="none",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
        # X-Forwarded-For and -Proto only from the listed proxies (uvicorn would believe
        # them from 127.0.0.1, where any local client could name another address).
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=list(settings.trusted_proxies),
    )


def for_many_connections(loop: asyncio.AbstractEventLoop) -> dict[str, int | None]:
    """Ready this process and its event loop for as many connections as the system allows
    (``raise_file_limit``, ``AcceptErrors``); the limit of open files, and what it was,
    for the log line that says ``serve`` started."""
    limits = raise_file_limit()
    loop.set_exception_handler(AcceptErrors(loop.get_exception_handler()))
    before, after = limits if limits is not None else (None, None)
    return {"open_files": after, "open_files_before": before}


def raise_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit of open files to its hard limit, as ``serve``
    starts: every connection, open stream and SQLite file takes a descriptor, and systems
    start processes at 1,024 while allowing far more. The limits before and after, or
    None where there is no such limit (or it cannot be changed)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 10_240]  # macOS: 10,240
    for limit in wanted:
        if limit <= soft:
            return soft, soft
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        except (ValueError, OSError):
            continue
        return soft, limit
    return soft, soft


class AcceptErrors:
    """The event loop's exception handler while ``serve`` runs. Out of file descriptors
    (or buffers), asyncio reports each ``accept()`` that fails, and its retry makes that
    thousands of lines a second under a flood of connections (78 MB of log in 30 s): here
    it is one line every ``every_s`` with how many were held back. Anything else goes to
    the handler that was there before (or the loop's default)."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(
        self,
        previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None,
        *,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._previous = previous
        self._every_s = every_s
        self._clock = clock
        self._next_at = float("-inf")
        self.held_back = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = self._clock()
        if now < self._next_at:
            self.held_back += 1
            return
        log.error(
            "connections cannot be accepted: the process is out of file descriptors "
            "(raise its open-files limit, or have the proxy in front limit connections)",
            extra={
                "action": "serve",
                "error": str(context.get("exception"))[:200],
                "held_back": self.held_back,  # the same error since the last such line
            },
        )
        self.held_back = 0
        self._next_at = now + self._every_s
