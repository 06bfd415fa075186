"""``tether serve`` against clients that send slowly, as a real process over raw sockets:
a body that does not arrive in time is answered ``408 request_timeout``, headers that do
not arrive in time close the connection, and SIGTERM ends the process while a client is
still uploading (graceful shutdown is bounded)."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import processes
from waiting import poll_until

DEADLINE_S = 60  # far above every timeout the tests set: a bound, never a measurement


@contextmanager
def serving(url: str, log: Path, **env: str) -> Iterator[tuple[processes.Process, int]]:
    """``tether serve`` (the API alone) with the test agent, ready to take requests."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = processes.spawn(
        "serve",
        "--port",
        str(port),
        "--workers",
        "0",
        env=processes.tether_env(url, **env),
        log=log,
    )

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll_until(ready, timeout=DEADLINE_S, what="serve to be ready")
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=DEADLINE_S)


def slow_upload(port: int) -> socket.socket:
    """A connection whose request headers promise 1,000 bytes of body and whose first byte
    is the last to arrive. Once a later request on another connection is answered, the
    server has read these headers (they were in its socket buffer first)."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    conn.sendall(
        b"POST /v1/runs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=DEADLINE_S).status_code == 200
    return conn


def read_all(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_sigterm_ends_serve_while_a_client_is_still_uploading(
    sqlite_url: str, tmp_path: Path
) -> None:
    # The body timeout is far away: what ends the process is the bounded shutdown.
    env = {"TETHER_HTTP_BODY_TIMEOUT_S": "3600", "TETHER_SHUTDOWN_TIMEOUT_S": "1"}
    with serving(sqlite_url, tmp_path / "serve.log", **env) as (proc, port):
        conn = slow_upload(port)
        try:
            proc.send_signal(signal.SIGTERM)
            poll_until(lambda: proc.poll() is not None, timeout=DEADLINE_S, what="serve to exit")
        finally:
            conn.close()
        assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]


def test_a_body_that_does_not_arrive_in_time_is_answered_408(
    sqlite_url: str, tmp_path: Path
) -> None:
    with serving(sqlite_url, tmp_path / "serve.log", TETHER_HTTP_BODY_TIMEOUT_S="1") as (_, port):
        conn = slow_upload(port)
        with conn:
            answer = read_all(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    refused = json.loads(body)
    assert refused["ok"] is False and refused["error"] == "request_timeout", refused


def test_headers_that_do_not_arrive_in_time_close_the_connection(
    sqlite_url: str, tmp_path: Path
) -> None:
    with serving(sqlite_url, tmp_path / "serve.log", TETHER_HTTP_HEADER_TIMEOUT_S="1") as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # and never the end
            answer = read_all(conn)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        # A client that sends its headers in time is served as before.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=DEADLINE_S).status_code == 200
