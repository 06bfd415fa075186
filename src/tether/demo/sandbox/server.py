"""Running the sandbox: ``serve`` (blocking, for the CLI) and ``start_in_thread`` (tests, demo)."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from types import TracebackType

import httpx
import uvicorn

from tether.demo.sandbox.app import create_app

log = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.01


def serve(host: str = "127.0.0.1", port: int = 8100, db_path: str = "./sandbox.db") -> None:
    """Serve the sandbox until interrupted (``tether sandbox serve``)."""
    uvicorn.run(create_app(db_path), host=host, port=port, ws="none")


class RunningSandbox:
    """A sandbox serving on a background thread; ``stop()`` or leaving ``with`` ends it."""

    def __init__(
        self,
        *,
        url: str,
        db_path: str,
        server: uvicorn.Server,
        thread: threading.Thread,
        sock: socket.socket,
    ) -> None:
        self.url = url
        self.db_path = db_path
        self._server = server
        self._thread = thread
        self._socket = sock

    def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down (lifespan shutdown closes the database) and join its thread.

        Safe to call twice: the second call finds the thread already joined.
        """
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()
        if self._thread.is_alive():
            raise RuntimeError(f"sandbox at {self.url} did not stop within {timeout}s")

    def __enter__(self) -> RunningSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_in_thread(
    db_path: str,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    startup_timeout: float = 10.0,
) -> RunningSandbox:
    """Serve the sandbox on a background thread; return once it answers ``/healthz``.

    ``port=0`` picks a free port; the chosen one is in ``.url``.
    """
    sock = _bind(host, port)
    config = uvicorn.Config(
        create_app(db_path),
        log_config=None,  # leave the host program's logging configuration alone
        log_level="warning",
        access_log=False,
        ws="none",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="tether-sandbox", daemon=True
    )
    bound_host = f"[{host}]" if ":" in host else host
    running = RunningSandbox(
        url=f"http://{bound_host}:{sock.getsockname()[1]}",
        db_path=db_path,
        server=server,
        thread=thread,
        sock=sock,
    )
    thread.start()
    try:
        _wait_until_answering(running.url, thread, startup_timeout)
    except BaseException:
        running.stop()
        raise
    log.info("sandbox serving", extra={"url": running.url, "db_path": db_path})
    return running


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only when it does,
    # and without it every response waits ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _wait_until_answering(url: str, thread: threading.Thread, timeout: float) -> None:
    """Poll ``/healthz`` until it answers 200; fail early if the server thread died."""
    deadline = time.monotonic() + timeout
    # Plain HTTP on loopback: a context that loads no CA bundle (httpx's default loads one,
    # tens of milliseconds of CPU) and trusts nothing, as TLS is never used.
    with httpx.Client(timeout=1.0, verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)) as client:
        while True:
            if not thread.is_alive():
                raise RuntimeError(f"sandbox at {url} exited during startup")
            try:
                if client.get(f"{url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() >= deadline:
                raise TimeoutError(f"sandbox at {url} did not answer within {timeout}s")
            thread.join(_POLL_INTERVAL_S)  # waits between polls, returning early if it dies
