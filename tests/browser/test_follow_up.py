"""A follow-up in a real browser (the fixtures are tests/support/inbox_browser.py's): the owner
opens an answered run, asks a follow-up from its box, lands on the new run's page, which
lists the thread with the earlier run linked and the new one marked, and once the run is
carried (here by the test, with ``engine.run_until_stop``) the page shows its answer and
offers the next follow-up, while the earlier run no longer does."""

from __future__ import annotations

import re
from collections.abc import Iterator

import agents
import pytest
from inbox_browser import Served, browser, off_loop, own_scripts_only, page, serving, shot, sign_in
from playwright.sync_api import Page, expect

from tether import StopKind
from tether.runs import RunState

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page"]


@pytest.fixture
def answering(sqlite_url: str) -> Iterator[Served]:
    """The app for the test agent whose model answers a thread's first question with
    "forty-two" and every follow-up with the script's final message."""
    with serving(sqlite_url, agents.agent(), agents.script("answer")) as app:
        yield app


def test_a_follow_up_from_an_answered_runs_box_lands_on_the_new_run_in_the_same_thread(
    answering: Served, page: Page
) -> None:
    app = answering
    outcome = off_loop(lambda: app.engine.ask("dana", "what is it?"))
    assert outcome.kind is StopKind.ANSWERED
    first = outcome.run_id
    sign_in(page, app)
    page.goto(f"{app.url}/runs/{first}")
    expect(page.locator(".messages .role-assistant")).to_contain_text("forty-two")
    expect(page.locator("ol.thread-runs li")).to_have_count(1)
    page.get_by_label("Your question").fill("and then?")
    shot(page, "follow-up-box")
    page.get_by_role("button", name="Send the follow-up").click()

    expect(page).to_have_url(re.compile(rf"^{re.escape(app.url)}/runs/(?!{first})[0-9a-f]+$"))
    new_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("h1")).to_contain_text(new_id)
    expect(page.locator("dl.facts .state")).to_have_text("running")
    expect(page.locator("dl.facts .question")).to_have_text("and then?")
    rows = page.locator("ol.thread-runs li")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).get_by_role("link")).to_have_text(first)  # the earlier run, linked
    expect(rows.nth(0).locator(".thread-state")).to_have_text("answered")
    expect(rows.nth(1)).to_have_attribute("aria-current", "page")
    expect(rows.nth(1).get_by_role("link")).to_have_count(0)
    expect(page.get_by_role("button", name="Send the follow-up")).to_have_count(0)
    shot(page, "follow-up-sent")
    new = off_loop(lambda: app.engine.get_run(new_id)).run
    assert new.state is RunState.RUNNING and new.question == "and then?"
    assert new.thread_id == off_loop(lambda: app.engine.get_run(first)).run.thread_id

    assert off_loop(lambda: app.engine.run_until_stop(new_id)).kind is StopKind.ANSWERED
    page.reload()
    expect(page.locator("dl.facts .state")).to_have_text("answered")
    expect(page.locator(".messages .role-assistant")).to_contain_text("I have nothing more to do.")
    expect(page.get_by_role("button", name="Send the follow-up")).to_be_visible()
    shot(page, "follow-up-answered")
    rows.nth(0).get_by_role("link").click()
    expect(page).to_have_url(f"{app.url}/runs/{first}")
    expect(page.locator("ol.thread-runs li").nth(1).get_by_role("link")).to_have_text(new_id)
    expect(page.get_by_role("button", name="Send the follow-up")).to_have_count(0)
    own_scripts_only(page)
