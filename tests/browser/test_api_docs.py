"""No script from another origin runs on the inbox's origin (the fixtures are
tests/support/inbox_browser.py's): the API's documentation page is our own, rendered on the
server from the OpenAPI document, and loads nothing from elsewhere; and every page
carries a Content-Security-Policy under which Chromium refuses a script of another
origin, even one a page tried to add."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from inbox_browser import Served, browser, page, served, shot, sign_in
from playwright.sync_api import Page, expect
from served import free_port

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page", "served"]

# Adds a <script> of ``src`` to the page; resolves "ran" if it ran, else "refused".
ADD_SCRIPT = """(src) => new Promise((resolve) => {
  const script = document.createElement("script");
  script.src = src;
  script.onload = () => resolve(window.foreignRan === true ? "ran" : "refused");
  script.onerror = () => resolve("refused");
  document.head.appendChild(script);
})"""


class _Script(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"window.foreignRan = true;"
        self.send_response(200)
        self.send_header("Content-Type", "text/javascript")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign() -> Iterator[str]:
    """A script served by another origin (another port of this machine)."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/x.js"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def requests_seen(page: Page) -> Iterator[list[str]]:
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url))
    yield seen


def test_the_api_docs_are_our_own_page_and_load_nothing_from_elsewhere(
    served: Served, page: Page, foreign: str
) -> None:
    with requests_seen(page) as seen:
        answer = page.goto(served.url + "/docs")
        assert answer is not None and answer.ok
        expect(page.locator("h1")).to_have_text("tether HTTP API")
        expect(page.locator("#op-post-v1-runs")).to_contain_text("POST /v1/runs")
        expect(page.locator("#op-post-v1-runs")).to_contain_text("Start a run")
        page.get_by_role("link", name="/openapi.json").first.click()
        expect(page).to_have_url(served.url + "/openapi.json")
    assert seen and all(url.startswith(served.url + "/") for url in seen), seen
    page.goto(served.url + "/docs")
    assert page.evaluate("document.scripts.length") == 0
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy or "script-src 'none'" in policy
    assert page.evaluate(ADD_SCRIPT, foreign) == "refused"
    shot(page, "api-docs")

    redoc = page.goto(served.url + "/redoc")
    assert redoc is not None
    assert page.url == served.url + "/docs"  # the one documentation page
    assert page.evaluate("document.scripts.length") == 0


def test_the_inbox_s_pages_refuse_a_script_of_another_origin(
    served: Served, page: Page, foreign: str
) -> None:
    run_id, token = served.suspend()
    sign_in(page, served)
    for path in ("/", "/runs", f"/runs/{run_id}", f"/approve/{token}", "/login"):
        answer = page.goto(served.url + path)
        assert (
            answer is not None and "script-src 'self'" in answer.headers["content-security-policy"]
        ), path
        assert page.evaluate(ADD_SCRIPT, foreign) == "refused", path
        assert page.evaluate("window.foreignRan") is None
