"""A tree of sub-agents in a real browser (reference §18; the fixtures are
tests/support/inbox_browser.py's, the tree tests/support/inbox_trees.py's): the root's page
shows the tree and every request of it; a child's call approved there runs on the child,
the answer's page leads back to the root, whose page then shows it decided and, without a
reload, the child carried on; and a child that suspends while the root's page is open
brings its request to that page without a reload."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import downstream
import inbox_trees
import pytest
from inbox_browser import Served, browser, off_loop, own_scripts_only, page, serving, shot, sign_in
from playwright.sync_api import Locator, Page, expect
from waiting import run_sync

from tether import StopKind

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page"]


@pytest.fixture
def planning(sqlite_url: str) -> Iterator[Served]:
    """The app for the planner, whose tree's clerk and courier each ask for a send."""
    with serving(sqlite_url, inbox_trees.planner(), inbox_trees.script()) as app:
        yield app


def row(page: Page, run_id: str) -> Locator:
    """The line of one run in the page's tree."""
    return page.locator(f"#tree-run-{run_id} > .tree-line")


def mark_loaded(page: Page) -> None:
    """A marker on the loaded page: a reload would lose it."""
    page.evaluate("window.loadedOnce = true")


def test_a_child_s_call_approved_on_the_root_s_page_runs_on_the_child(
    planning: Served, page: Page
) -> None:
    tree = off_loop(lambda: inbox_trees.grow(planning.engine))
    sign_in(page, planning)
    page.goto(f"{planning.url}/")
    cards = page.locator(".tree-of")
    expect(cards).to_have_count(2)  # each child's request names its sub-agent and its root
    expect(cards.filter(has_text="courier")).to_contain_text(tree.root[:8])
    shot(page, "tree-inbox")
    page.goto(f"{planning.url}/runs/{tree.root}")
    expect(page.locator("li.tree-run")).to_have_count(4)
    expect(row(page, tree.root)).to_contain_text("(this run)")
    expect(row(page, tree.courier).locator(".state")).to_have_text("suspended")
    requests = page.locator("article.tree-request")
    expect(requests).to_have_count(2)
    courier = page.locator(f"#tree-request-{tree.courier}")
    expect(courier.locator("h3.tree-request-run")).to_contain_text("courier")
    expect(courier.locator("h3.tree-request-run")).to_contain_text("started by researcher")
    expect(courier.locator(".preview table.kv tr", has_text="item")).to_contain_text("c")
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "open")
    own_scripts_only(page)
    shot(page, "tree-root-before")
    assert downstream.effects() == []

    courier.get_by_label("Reason").fill("c is fine")
    courier.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    shot(page, "tree-child-approved")
    assert [(tool, item) for _, tool, item in downstream.effects()] == [("send", "c")]
    assert planning.tool_result(tree.courier) == {"done": "send", "item": "c"}  # the child's
    assert [d["reason"] for d in planning.decisions(tree.courier)] == ["c is fine"]
    assert planning.decisions(tree.clerk) == []

    page.get_by_role("link", name="Back to its tree's root").click()
    expect(page).to_have_url(f"{planning.url}/runs/{tree.root}")
    expect(requests).to_have_count(1)  # the clerk's alone waits now
    expect(page.locator(f"#tree-request-{tree.clerk}")).to_be_visible()
    expect(row(page, tree.courier).locator(".state")).not_to_have_text("suspended")
    expect(row(page, tree.courier).locator(".tree-waits")).to_have_count(0)
    expect(row(page, tree.courier).locator(".tree-decided")).to_have_text(
        "· last decision: approved by dana"
    )
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "open")
    shot(page, "tree-root-decided")
    mark_loaded(page)

    # A worker carries the courier, then the researcher it wakes: the root's page shows both
    # answered without a reload.
    assert off_loop(lambda: planning.engine.run_until_stop(tree.courier)).kind is StopKind.ANSWERED
    expect(row(page, tree.courier).locator(".state")).to_have_text("answered")
    assert (
        off_loop(lambda: planning.engine.run_until_stop(tree.researcher)).kind is StopKind.ANSWERED
    )
    expect(row(page, tree.researcher).locator(".state")).to_have_text("answered")
    assert page.evaluate("window.loadedOnce") is True
    shot(page, "tree-root-after")


def test_a_child_that_suspends_brings_its_request_to_the_open_root_s_page(
    planning: Served, page: Page
) -> None:
    # The root has started its children; none of them has been carried yet.
    started = off_loop(lambda: planning.engine.ask("dana", inbox_trees.QUESTION))
    assert started.kind is StopKind.WAITING
    clerk, researcher = (r.id for r in planning.engine.runner.store.children(started.run_id))
    sign_in(page, planning)
    page.goto(f"{planning.url}/runs/{started.run_id}")
    expect(row(page, clerk)).to_contain_text("waits for a worker")
    expect(page.locator("article.tree-request")).to_have_count(0)
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "open")
    mark_loaded(page)

    with ThreadPoolExecutor(max_workers=1) as pool:
        carried = pool.submit(lambda: run_sync(planning.engine.run_until_stop(clerk)))
        assert carried.result(timeout=60).kind is StopKind.SUSPENDED
    expect(page.locator(f"#tree-request-{clerk}")).to_be_visible()
    expect(row(page, clerk).locator(".state")).to_have_text("suspended")
    # The researcher starts a courier of its own: the root's stream says nothing of it, the
    # researcher's signal does.
    outcome = off_loop(lambda: planning.engine.run_until_stop(researcher))
    assert outcome.kind is StopKind.WAITING
    [courier] = planning.engine.runner.store.children(researcher)
    expect(page.locator(f"#tree-run-{courier.id}")).to_be_visible()
    assert off_loop(lambda: planning.engine.run_until_stop(courier.id)).kind is StopKind.SUSPENDED
    expect(page.locator(f"#tree-request-{courier.id}")).to_be_visible()
    expect(page.locator("article.tree-request")).to_have_count(2)
    assert page.evaluate("window.loadedOnce") is True
    shot(page, "tree-root-live")
