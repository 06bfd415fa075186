"""The browser tests' fixtures: one Chromium a module, a fresh context (cookies, pages) a
test, and the app served for the test agent, for a halted run of it, or for the payments
agent (tests/support/inbox_browser.py)."""

from __future__ import annotations

from collections.abc import Iterator

import agents
import pytest
from inbox_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Served,
    off_loop,
    payment_script,
    payments_agent,
    serving,
)
from playwright.sync_api import Browser, Page, sync_playwright

from tether import StopKind


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
        app.keys["boss"] = off_loop(lambda: app.engine.add_user("boss"))
        yield app
