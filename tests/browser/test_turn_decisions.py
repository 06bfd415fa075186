"""A turn that asks for two sends (reference §6: one suspension waits on every call of the
turn that needs a decision) in a real browser (the fixtures are tests/browser/
inbox_browser.py's): the run's page shows both calls, each with its own form, and a form that
decides them all; one send approved and the other declined, on one page or call by call,
and the run then shows the first sent and the second declined."""

from __future__ import annotations

from collections.abc import Iterator

import agents
import downstream
import pytest
from inbox_browser import Served, browser, off_loop, own_scripts_only, page, serving, shot, sign_in
from playwright.sync_api import Page, expect

from tether import StopKind
from tether.runs import RunState

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page"]


@pytest.fixture
def turn(sqlite_url: str) -> Iterator[Served]:
    """The app for the test agent playing a turn of two sends with a read between them."""
    with serving(sqlite_url, agents.agent(), agents.script("two_sends")) as app:
        yield app


def suspend_turn(app: Served) -> tuple[str, list[str]]:
    """dana's run suspended on its two sends, and their tool call ids in call order."""
    outcome = off_loop(lambda: app.engine.ask("dana", "send b and c"))
    assert outcome.kind is StopKind.SUSPENDED
    calls = [n.tool_call_id for n in app.notifier.notices if n.run_id == outcome.run_id]
    assert len(calls) == 2
    return outcome.run_id, calls


def carried_out(page: Page, app: Served, run_id: str) -> None:
    """Once the workers carry the run on, its page shows send b sent and send c declined."""
    off_loop(lambda: app.engine.run_until_stop(run_id))
    page.goto(f"{app.url}/runs/{run_id}")
    expect(page.locator(".state")).to_have_text("answered")
    results = page.locator(".msg.role-tool pre.content")
    expect(results).to_have_count(3)
    expect(results.nth(0)).to_have_text('{"done":"send","item":"b"}')
    expect(results.nth(2)).to_contain_text("declined_by_user")
    assert [item for _, _, item in downstream.effects()] == ["b"]
    assert off_loop(lambda: app.engine.get_run(run_id)).run.state is RunState.ANSWERED


def test_one_send_approved_and_the_other_declined_on_one_page(turn: Served, page: Page) -> None:
    run_id, (b, c) = suspend_turn(turn)
    sign_in(page, turn)
    page.goto(f"{turn.url}/runs/{run_id}")
    calls = page.locator("article.call-request")
    expect(calls).to_have_count(2)
    expect(calls.nth(0)).to_have_attribute("data-tool-call-id", b)
    expect(calls.nth(1)).to_have_attribute("data-tool-call-id", c)
    expect(calls.nth(0).locator(".preview table.kv tr", has_text="item")).to_contain_text("b")
    expect(calls.nth(1).locator(".preview table.kv tr", has_text="item")).to_contain_text("c")
    expect(calls.nth(0).get_by_role("button", name="Approve", exact=True)).to_be_visible()
    expect(calls.nth(1).get_by_role("button", name="Decline", exact=True)).to_be_visible()
    expect(page.locator(".waiting-count")).to_have_text("2")
    own_scripts_only(page)

    every = page.locator("form.decide-all")
    every.get_by_label("Approve send 1", exact=True).check()
    every.get_by_label("Decline send 2", exact=True).check()
    every.get_by_label("Reason for all").fill("b yes, c no")
    shot(page, "turn-decide-all")
    assert downstream.effects() == []  # nothing is decided before the button
    every.get_by_role("button", name="Decide as chosen").click()

    expect(page.locator("section.outcome h1")).to_have_text("Decided")
    answers = page.locator("table.answers td.answer")
    expect(answers.nth(0)).to_contain_text("executed")
    expect(answers.nth(1)).to_contain_text("declined")
    shot(page, "turn-decided")
    carried_out(page, turn, run_id)


def test_each_send_decided_by_its_own_form_the_first_recorded_until_the_second(
    turn: Served, page: Page
) -> None:
    run_id, (b, c) = suspend_turn(turn)
    sign_in(page, turn)
    page.goto(f"{turn.url}/runs/{run_id}")
    first = page.locator(f'article.call-request[data-tool-call-id="{b}"]')
    first.get_by_role("button", name="Approve", exact=True).click()

    expect(page.locator("section.outcome h1")).to_have_text("Recorded")
    expect(page.locator(".waiting-count")).to_have_text("1")
    assert downstream.effects() == []  # recorded: nothing of the turn runs yet
    page.get_by_role("link", name="Decide the others").click()

    first = page.locator(f'article.call-request[data-tool-call-id="{b}"]')
    expect(first.locator(".call-decided .decision")).to_have_text("approve")
    expect(first.locator("form.decide")).to_have_count(0)
    expect(page.locator("form.decide-all")).to_have_count(0)
    shot(page, "turn-one-recorded")
    second = page.locator(f'article.call-request[data-tool-call-id="{c}"]')
    second.get_by_label("Reason").fill("not c")
    second.get_by_role("button", name="Decline", exact=True).click()

    expect(page.locator("section.outcome h1")).to_have_text("Declined")
    carried_out(page, turn, run_id)
