"""A TCP proxy in front of the real PostgreSQL server that can cut a connection off in
the middle of a COMMIT: the COMMIT reaches the server (so it lands) and the connection
is closed before the server's answer reaches the client, as when a network drops or a
server dies right after committing; or, armed with ``lands=False``, the COMMIT never
reaches the server (which then rolls the transaction back). Either way the client sees
the same thing: a connection lost at its COMMIT. Everything else is relayed unchanged.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

# psycopg 3 sends COMMIT with the simple query protocol: 'Q', int32 length, "COMMIT\0".
COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"


class Proxy:
    """Relays 127.0.0.1:``port`` to ``target``; ``arm()`` cuts the next COMMIT off."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._armed = threading.Event()
        self._lands = True
        self._lock = threading.Lock()
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, *, lands: bool = True) -> None:
        """Cut off the next COMMIT that passes (once): after the server has it, or, with
        ``lands=False``, before."""
        self._lands = lands
        self._armed.set()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        """Client → server; marks the pair when an armed COMMIT went through."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if COMMIT in data and self._take():
                    cut.set()
                    if not self._lands:  # the server never gets it
                        server.shutdown(socket.SHUT_RDWR)
                        break
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        """Server → client; the answer to a cut COMMIT is dropped with the connection."""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if cut.is_set():
                    break
                client.sendall(data)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _take(self) -> bool:
        with self._lock:
            if not self._armed.is_set():
                return False
            self._armed.clear()
            self.cuts += 1
            return True


@contextlib.contextmanager
def proxy(host: str = "127.0.0.1", port: int = 5432) -> Iterator[Proxy]:
    running = Proxy((host, port))
    try:
        yield running
    finally:
        running.close()
