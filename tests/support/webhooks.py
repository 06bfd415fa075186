"""Local webhook receivers: one that collects the suspension notices tether POSTs to it, and
one that refuses the first few."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class NoticeReceiver:
    """Collects the notices POSTed to ``url``, from a thread of its own."""

    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        received = self.notices

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notices"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> NoticeReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def token_for(self, run_id: str) -> str:
        """The token of the latest notice for ``run_id``."""
        for notice in reversed(self.notices):
            if notice["run_id"] == run_id:
                return str(notice["token"])
        raise LookupError(run_id)


@contextmanager
def receiver() -> Iterator[NoticeReceiver]:
    with NoticeReceiver() as r:
        yield r


class Flaky:
    """A webhook receiver that answers 503 ``failures`` times, then 204."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.received: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.failures > 0:
                    outer.failures -= 1
                    self.send_response(503)
                else:
                    outer.received.append(body)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
