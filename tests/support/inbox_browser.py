"""The inbox in a real browser, for the browser tests: the app for an agent served by
uvicorn on a loopback port (``serving``), with a hold on the POSTs of approval links so
the two clicks of a double click reach the engine together; Debian's Chromium and how it
is started; signing in, screenshots, and the check that a page runs only the inbox's own
script. And a payments agent whose account hides a character (U+202E), for the tests of
what an approver is shown of it.

And the fixtures built of these: ``browser`` (one Chromium a module), ``page`` (a fresh
context a test), ``served`` (the app for the test agent), ``halted`` (a run of it halted
after its first step) and ``payments`` (the app for the payments agent). A test module
imports those it uses by name, and lists them in ``__all__`` (pytest finds them there)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import agents
import processes
import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright
from served import free_port
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from waiting import poll_until, run_sync

from tether import Agent, Engine, MemoryNotifier, ScriptedModel, StopKind, tool
from tether.api.app import create_app
from tether.config import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
T = TypeVar("T")
SCREENSHOTS = processes.ROOT / "test-artifacts" / "screenshots"


class DecisionPosts:
    """Wraps the app around the POSTs to approval links: it records each one's status and,
    once ``pair_next`` is called, holds the next one (its body read, so the browser
    cancelling it changes nothing) until another arrives or ``hold_s`` passes, so the two
    clicks of a double click reach the engine together, as on a slow network."""

    def __init__(self, app: ASGIApp, hold_s: float = 10.0) -> None:
        self.app = app
        self.hold_s = hold_s
        self.arrived = 0
        self.statuses: list[int] = []
        self._paired = False
        self._second: asyncio.Event | None = None

    def pair_next(self) -> None:
        """Hold the next POST until the one after it arrives."""
        self.arrived = 0
        self.statuses.clear()
        self._paired = True
        self._second = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].startswith("/approve/")
        ):
            await self.app(scope, receive, send)
            return
        self.arrived += 1
        if self._second is None:
            self._second = asyncio.Event()
        body = await _read_body(receive)
        if self._paired and self.arrived == 1:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._second.wait(), self.hold_s)
        else:
            self._second.set()
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        status = 0

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, replay, recording)
        finally:
            self.statuses.append(status)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            return b"".join(chunks)


@dataclass
class Served:
    engine: Engine
    notifier: MemoryNotifier
    url: str
    posts: DecisionPosts
    keys: dict[str, str] = field(default_factory=dict)

    def suspend(self, user: str = "dana") -> tuple[str, str]:
        outcome = off_loop(lambda: self.engine.ask(user, "send b"))
        assert outcome.kind is StopKind.SUSPENDED
        return outcome.run_id, self.notifier.last(outcome.run_id).token

    def decisions(self, run_id: str) -> list[dict[str, Any]]:
        events = off_loop(lambda: self.engine.events(run_id))
        return [e.data for e in events if e.kind in ("approved", "declined")]

    def tool_result(self, run_id: str) -> dict[str, Any]:
        """What the model sees of the run's one tool call."""
        view = off_loop(lambda: self.engine.get_run(run_id))
        [message] = [m for m in view.messages if m.get("role") == "tool"]
        content = message["content"]
        result: dict[str, Any] = json.loads(content) if isinstance(content, str) else content
        return result


def off_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an engine coroutine to completion on a thread of its own: Playwright's sync API
    keeps an event loop running on the test's thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: run_sync(make())).result(timeout=60)


@contextlib.contextmanager
def serving(url: str, agent: Agent, model: ScriptedModel) -> Iterator[Served]:
    """The app for ``agent``, served by uvicorn in a thread until the block ends."""
    notifier = MemoryNotifier()
    engine = Engine(
        agent=agent, model=model, settings=Settings(database_url=url), notifier=notifier
    )
    posts = DecisionPosts(create_app(engine))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            posts, host="127.0.0.1", port=port, log_level="warning", lifespan="off", ws="none"
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        poll_until(lambda: server.started, timeout=15, what="uvicorn to start")
        yield Served(
            engine=engine,
            notifier=notifier,
            url=f"http://127.0.0.1:{port}",
            posts=posts,
            keys={"dana": off_loop(lambda: engine.operator.add_user("dana"))},
        )
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        engine.close()
    assert not thread.is_alive(), "uvicorn did not stop"


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def own_scripts_only(page: Page) -> None:
    """The page runs no script but the inbox's own file (no inline script): at most
    ``/static/live.js``, on the pages that follow runs."""
    sources = page.evaluate("Array.from(document.scripts, (s) => s.getAttribute('src'))")
    assert sources in ([], ["/static/live.js"]), sources


def sign_in(page: Page, served: Served, user: str = "dana") -> None:
    page.goto(served.url + "/")
    expect(page).to_have_url(served.url + "/login?next=/")
    page.fill("#key", served.keys[user])
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.locator("header.top")).to_contain_text(f"Signed in as {user}")


# -- a payment to an account that hides a character ------------------------------------------

SPOOF = "acct-1234\u202e9876-tcca"  # reads as acct-1234acct-6789 where it is not escaped
SHOWN = "acct-1234\\u202e9876-tcca"
QUESTION = f"Pay the March invoice to {SPOOF} (not a literal \\u202e)"
SHOWN_QUESTION = "Pay the March invoice to acct-1234\\u202e9876-tcca (not a literal \\u202e)"


def _pay_preview(args: Any, scope: Any) -> dict[str, Any]:
    return {"account": args.account, "amount": args.amount}


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    preview=_pay_preview,
    approvers="others",
)
def pay(account: str, amount: int) -> dict[str, Any]:
    """Pay an account (someone other than the run's owner decides it: four eyes)."""
    return {"paid": account, "amount": amount}


def payments_agent() -> Agent:
    return Agent(name="payments", system_prompt="Pay.", tools=(pay,), resolve_scope=agents.resolve)


def payment_script(account: str = SPOOF) -> ScriptedModel:
    """Every run asks to pay ``account`` 40, then answers."""
    call = {"name": "pay", "arguments": {"account": account, "amount": 40}}
    return ScriptedModel([{"tool_calls": [call]}, {"content": "paid"}])


def asked(app: Served, question: str = QUESTION) -> str:
    """dana's run suspended on its payment."""
    outcome = off_loop(lambda: app.engine.ask("dana", question))
    assert outcome.kind is StopKind.SUSPENDED
    return outcome.run_id


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for the module; each test gets its own context (cookies, pages)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium. Install it with "
            "`apt-get install chromium` (.ci/run does); Playwright's own download is not used."
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def served(sqlite_url: str) -> Iterator[Served]:
    """The app for the test agent (its confirmed ``send`` takes one string, ``item``)."""
    with serving(sqlite_url, agents.agent(), agents.script("send")) as app:
        yield app


@pytest.fixture
def halted(sqlite_url: str) -> Iterator[tuple[Served, str]]:
    """The app for the test agent, and dana's run halted after its first step (a read; its
    script goes on with a write)."""
    with serving(sqlite_url, agents.agent(), agents.script("work")) as app:
        outcome = off_loop(lambda: app.engine.ask("dana", "go", limits={"max_steps": 1}))
        assert outcome.kind is StopKind.HALTED
        yield app, outcome.run_id


@pytest.fixture
def payments(sqlite_url: str) -> Iterator[Served]:
    """The app for the payments agent, with dana (who asks) and boss (who decides)."""
    with serving(sqlite_url, payments_agent(), payment_script()) as app:
        app.keys["boss"] = off_loop(lambda: app.engine.operator.add_user("boss"))
        yield app
