"""The inbox in a real browser: Playwright drives Debian's Chromium against the app served
by uvicorn on a loopback port. Sign in, see the request, approve it with a double click
(it resumes once, by the store), see a changed request's diff side by side, and fork a
halted run from its page.

Chromium comes from the system (``apt-get install chromium``; CI does it); Playwright's
own browser download is never used. Without /usr/bin/chromium this test fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import agents
import downstream
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
def _serving(url: str, agent: Agent, model: ScriptedModel) -> Iterator[Served]:
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


@pytest.fixture
def served(sqlite_url: str) -> Iterator[Served]:
    """The app for the test agent (its confirmed ``send`` takes one string, ``item``)."""
    with _serving(sqlite_url, agents.agent(), agents.script("send")) as app:
        yield app


def _ship_preview(args: Any, scope: Any) -> dict[str, Any]:
    return {"sku": args.sku, "quantity": args.quantity, "speed": args.speed}


@tool(effect="write", needs_confirmation=True, dedupes=True, preview=_ship_preview)
def ship(
    sku: str,
    quantity: int,
    rush: bool = False,
    speed: Literal["ground", "air"] = "ground",
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Ship an order (a write a human confirms); its downstream deduplicates by key."""
    return {"shipped": sku, "quantity": quantity, "rush": rush, "speed": speed}


@pytest.fixture
def shipping(sqlite_url: str) -> Iterator[Served]:
    """The app for an agent whose one tool takes a string, an integer, a boolean, an enum
    and a list: every kind of control of the edit form."""
    agent = Agent(
        name="shipping", system_prompt="Ship.", tools=(ship,), resolve_scope=agents.resolve
    )
    order = {"sku": "A-1", "quantity": 3}
    model = ScriptedModel(
        [{"tool_calls": [{"name": "ship", "arguments": order}]}, {"content": "shipped"}]
    )
    with _serving(sqlite_url, agent, model) as app:
        yield app


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


def test_sign_in_see_the_request_and_a_double_click_approves_once(
    served: Served, page: Page
) -> None:
    run_id, token = served.suspend()
    sign_in(page, served)
    card = page.locator(f"#run-{run_id}")
    expect(card).to_contain_text("send")
    expect(card.locator("table.kv tr", has_text="price")).to_contain_text("100")
    expect(card.locator(".badge")).to_contain_text("left")
    shot(page, "inbox")

    page.goto(f"{served.url}/approve/{token}")
    expect(page.get_by_role("heading", name="Approve this action?")).to_be_visible()
    expect(page.locator(".preview table.kv tr", has_text="item")).to_contain_text("b")
    shot(page, "approval")
    assert served.decisions(run_id) == [] and downstream.effects() == []  # the GET did nothing

    # Two clicks at the button's place, the second while the first answer is on its way
    # (the mouse, unlike a locator, does not wait for the pending navigation).
    box = page.get_by_role("button", name="Approve").bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    served.posts.pair_next()
    page.mouse.click(x, y)
    poll_until(lambda: served.posts.arrived == 1, timeout=15, what="the first click")
    page.mouse.click(x, y)
    # The page shows whichever answer came last: the decision, or that it was decided.
    expect(page.locator("section.outcome h1")).to_have_text(
        re.compile("^(Approved|Already decided)$")
    )
    shot(page, "double-click")
    poll_until(lambda: len(served.posts.statuses) >= 2, timeout=15, what="both POSTs")
    assert sorted(served.posts.statuses) == [200, 409]  # one decision, one already_resumed
    assert [e[1] for e in downstream.effects()] == ["send"]
    assert [d["decision"] for d in served.decisions(run_id)] == ["approve"]

    page.goto(f"{served.url}/approve/{token}")
    expect(page.locator("section.outcome h1")).to_have_text("Already decided")
    expect(page.locator("dd.decision")).to_have_text("approve")
    shot(page, "already-decided")
    page.get_by_role("link", name="Back to the run").click()
    expect(page.locator("table.timeline")).to_contain_text("approved")
    expect(page.locator("table.budget tr", has_text="tool calls")).to_contain_text("1")
    shot(page, "run")


def test_a_changed_request_shows_the_diff_side_by_side_and_can_be_approved_again(
    served: Served, page: Page
) -> None:
    run_id, token = served.suspend()
    sign_in(page, served)
    page.goto(f"{served.url}/approve/{token}")
    expect(page.locator(".preview table.kv tr", has_text="price")).to_contain_text("100")
    downstream.set_world("price", "90")

    page.get_by_role("button", name="Approve").click()
    expect(page.locator("section.outcome h1")).to_have_text("The details changed")
    row = page.locator("table.diff tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("th")).to_have_text("price")
    expect(row.locator("td.before")).to_have_text("100")
    expect(row.locator("td.after")).to_have_text("90")
    before_box, after_box = (
        row.locator("td.before").bounding_box(),
        row.locator("td.after").bounding_box(),
    )
    assert before_box and after_box and before_box["x"] < after_box["x"]  # side by side
    assert abs(before_box["y"] - after_box["y"]) < 1
    expect(page.locator(".preview table.kv tr", has_text="price")).to_contain_text("90")
    shot(page, "changed")
    assert downstream.effects() == []

    page.get_by_role("button", name="Approve").click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    shot(page, "approved-after-change")
    assert [e[1] for e in downstream.effects()] == ["send"]
    assert [d["decision"] for d in served.decisions(run_id)] == ["approve", "approve"]


def test_the_browser_holds_only_the_inbox_s_own_script_and_the_session_cookie_is_http_only(
    served: Served, page: Page
) -> None:
    sign_in(page, served)
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["tether_session"]
    assert session["httpOnly"] and session["sameSite"] == "Lax"
    assert page.evaluate("document.cookie") == ""
    own_scripts_only(page)
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(served.url + "/login")
    page.goto(served.url + "/")
    expect(page).to_have_url(served.url + "/login?next=/")


def test_a_decline_with_a_reason_is_told_to_the_model_and_shown_afterwards(
    served: Served, page: Page
) -> None:
    run_id, token = served.suspend()
    sign_in(page, served)
    page.goto(f"{served.url}/approve/{token}")
    page.get_by_label("Reason").fill("Wrong customer: send it to Henderson.")
    page.get_by_role("button", name="Decline").click()
    expect(page.locator("section.outcome h1")).to_have_text("Declined")
    expect(page.locator(".decision-reason")).to_have_text("Wrong customer: send it to Henderson.")
    shot(page, "declined-with-reason")
    result = served.tool_result(run_id)
    assert result["error"] == "declined_by_user"
    assert result["reason"] == "Wrong customer: send it to Henderson."
    assert [d["reason"] for d in served.decisions(run_id)] == [result["reason"]]
    assert downstream.effects() == []

    page.goto(f"{served.url}/approve/{token}")
    expect(page.locator("section.outcome h1")).to_have_text("Already decided")
    expect(page.locator(".decision-reason")).to_have_text("Wrong customer: send it to Henderson.")


def test_an_edit_from_the_inbox_is_previewed_then_approved_and_executes_as_edited(
    served: Served, page: Page
) -> None:
    run_id, _ = served.suspend()
    sign_in(page, served)
    card = page.locator(f"#run-{run_id}")
    card.locator("summary", has_text="Edit the arguments").click()
    expect(card.get_by_label("Item")).to_have_value("b")
    card.get_by_label("Item").fill("c")
    card.get_by_role("button", name="Preview the edits").click()

    expect(page.get_by_role("heading", name="Approve the edited action?")).to_be_visible()
    row = page.locator("table.edits tbody tr")
    expect(row.locator("td.before")).to_have_text("b")
    expect(row.locator("td.after")).to_have_text("c")
    expect(page.locator(".preview table.kv tr", has_text="item")).to_contain_text("c")
    own_scripts_only(page)
    shot(page, "edit-preview")
    assert served.decisions(run_id) == [] and downstream.effects() == []  # the preview did nothing

    page.get_by_label("Reason").fill("c, not b")
    page.get_by_role("button", name="Approve with these edits").click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    expect(page.locator(".edited-arguments")).to_contain_text("c")
    shot(page, "approved-with-edits")
    assert [e[1:] for e in downstream.effects()] == [("send", "c")]
    assert served.tool_result(run_id)["edited_by_user"] == {"arguments": {"item": "c"}}
    [decision] = served.decisions(run_id)
    assert decision["reason"] == "c, not b"


def test_an_invalid_edit_shows_the_error_and_the_request_can_still_be_edited_and_approved(
    shipping: Served, page: Page
) -> None:
    run_id, token = shipping.suspend()
    sign_in(page, shipping)
    page.goto(f"{shipping.url}/approve/{token}")
    page.locator("summary", has_text="Edit the arguments").click()
    expect(page.get_by_label("Quantity")).to_have_value("3")
    expect(page.get_by_label("Rush")).not_to_be_checked()
    expect(page.get_by_label("Speed")).to_have_value("ground")
    page.get_by_label("Labels").fill('"fragile"')  # JSON, but not a list
    page.get_by_role("button", name="Preview the edits").click()
    expect(page.locator(".edit-error")).to_contain_text("labels")
    expect(page.get_by_label("Labels")).to_have_value('"fragile"')  # as typed, open
    own_scripts_only(page)
    shot(page, "edit-invalid")
    assert shipping.decisions(run_id) == []

    page.get_by_label("Labels").fill('["fragile"]')
    page.get_by_label("Quantity").fill("4")
    page.get_by_label("Rush").check()
    page.get_by_label("Speed").select_option("air")
    page.get_by_role("button", name="Preview the edits").click()
    expect(page.locator(".preview table.kv tr", has_text="speed")).to_contain_text("air")
    page.get_by_role("button", name="Approve with these edits").click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    edited = {"sku": "A-1", "quantity": 4, "rush": True, "speed": "air", "labels": ["fragile"]}
    result = shipping.tool_result(run_id)
    assert result["edited_by_user"] == {"arguments": edited}
    assert result["result"] == {"shipped": "A-1", "quantity": 4, "rush": True, "speed": "air"}


@pytest.fixture
def halted(sqlite_url: str) -> Iterator[tuple[Served, str]]:
    """The app for the test agent, and dana's run halted after its first step (a read; its
    script goes on with a write)."""
    with _serving(sqlite_url, agents.agent(), agents.script("work")) as app:
        outcome = off_loop(lambda: app.engine.ask("dana", "go", limits={"max_steps": 1}))
        assert outcome.kind is StopKind.HALTED
        yield app, outcome.run_id


def test_the_fork_button_on_a_halted_runs_page_opens_the_dry_run_fork_and_its_lineage(
    halted: tuple[Served, str], page: Page
) -> None:
    served, parent = halted
    sign_in(page, served)
    page.goto(f"{served.url}/runs/{parent}")
    expect(page.locator(".agent-version")).to_have_text(served.engine.agent.agent_version)
    expect(page.locator("#fork-at-step")).to_have_value("1")
    page.check("#fork-dry-run")
    shot(page, "run-fork-form")
    page.get_by_role("button", name="Fork", exact=True).click()
    expect(page.locator(".forked-from")).to_be_visible()  # the new run's page
    [fork] = off_loop(lambda: served.engine.forks_of(parent))
    expect(page).to_have_url(f"{served.url}/runs/{fork.id}")
    assert fork.dry_run and fork.forked_from == {"run_id": parent, "step": 1}
    expect(page.locator(".dry-run")).to_be_visible()
    expect(page.locator(".forked-from")).to_contain_text("at step 1")
    shot(page, "run-forked")
    page.locator(".forked-from a").click()
    expect(page).to_have_url(f"{served.url}/runs/{parent}")
    expect(page.locator(".forks a")).to_have_text(fork.id)
    assert downstream.effects() == []  # forking executed nothing
