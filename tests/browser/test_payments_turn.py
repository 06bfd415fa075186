"""A turn of two payments whose previews read the balance they move (``payments.py``),
approved all at once in a real browser (the fixtures are tests/support/inbox_browser.py's):
the first is carried out, which changes what the second's preview reads, so the second is
not carried out and waits for a new decision (reference §15, invariant 7). The result page
says so call by call (the first carried out, the second changed, with what changed and
why), never that the whole turn was carried out; the run's page says beforehand that this
can happen; deciding the second again carries it out."""

from __future__ import annotations

from collections.abc import Iterator

import downstream
import payments
import pytest
from inbox_browser import Served, browser, off_loop, own_scripts_only, page, serving, shot, sign_in
from playwright.sync_api import Page, expect

from tether import ScriptedModel, StopKind
from tether.runs import RunState

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page"]


@pytest.fixture
def pays(sqlite_url: str) -> Iterator[Served]:
    """The app for the payments agent playing a turn of two payments (30, then 20)."""
    model = ScriptedModel(payments.SCRIPTS["two_payments"])
    with serving(sqlite_url, payments.agent(), model) as app:
        yield app


def paid() -> list[str]:
    return [item for _, tool, item in downstream.effects() if tool == "pay"]


def test_approving_both_payments_shows_the_first_paid_and_the_second_changed_with_why(
    pays: Served, page: Page
) -> None:
    outcome = off_loop(lambda: pays.engine.ask("dana", "pay them"))
    assert outcome.kind is StopKind.SUSPENDED
    first, second = (n.tool_call_id for n in pays.notifier.notices)
    sign_in(page, pays)
    page.goto(f"{pays.url}/runs/{outcome.run_id}")
    expect(page.locator("article.call-request")).to_have_count(2)
    # Before deciding, the page says that a later payment may come back.
    expect(page.locator(".turn-order")).to_contain_text("comes back to you with its new preview")
    shot(page, "payments-turn")
    page.locator("form.decide-all").get_by_role("button", name="Approve all").click()

    expect(page.locator("section.outcome h1")).to_have_text("Decided")
    assert paid() == ["30"]
    expect(page.locator(".notice.again")).to_contain_text("Not everything could be carried out")
    expect(page.locator("section.outcome")).not_to_contain_text("the turn was carried out")
    paid_row = page.locator(f'table.answers tr[data-tool-call-id="{first}"]')
    expect(paid_row.locator("th")).to_contain_text('pay {"amount": 30}')
    expect(paid_row.locator("td.answer")).to_contain_text("Carried out")
    changed_row = page.locator(f'table.answers tr[data-tool-call-id="{second}"]')
    expect(changed_row.locator("td.answer")).to_contain_text("Changed before it ran")
    diff = changed_row.locator("table.diff tbody tr")
    expect(diff).to_have_count(1)
    expect(diff.locator("th")).to_have_text("balance_after")
    expect(diff.locator("td.before")).to_have_text("80")
    expect(diff.locator("td.after")).to_have_text("50")
    expect(page.locator(".why-changed")).to_contain_text("an earlier action ran first")
    own_scripts_only(page)
    shot(page, "payments-decided")

    changed_row.get_by_role("link", name="Review it and decide again").click()
    again = page.locator(f'article.call-request[data-tool-call-id="{second}"]')
    expect(again.locator(".preview table.kv tr", has_text="balance_after")).to_contain_text("50")
    again.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    assert paid() == ["30", "20"]
    off_loop(lambda: pays.engine.run_until_stop(outcome.run_id))
    view = off_loop(lambda: pays.engine.get_run(outcome.run_id))
    assert view.run.state is RunState.ANSWERED


def test_each_payment_by_its_own_form_the_last_page_shows_the_other_one_changed(
    pays: Served, page: Page
) -> None:
    outcome = off_loop(lambda: pays.engine.ask("dana", "pay them"))
    first, second = (n.tool_call_id for n in pays.notifier.notices)
    sign_in(page, pays)
    page.goto(f"{pays.url}/runs/{outcome.run_id}")
    later = page.locator(f'article.call-request[data-tool-call-id="{second}"]')
    later.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("section.outcome h1")).to_have_text("Recorded")
    page.get_by_role("link", name="Decide the others").click()
    earlier = page.locator(f'article.call-request[data-tool-call-id="{first}"]')
    earlier.get_by_role("button", name="Approve", exact=True).click()

    # The page of the last decision: its own payment made, and the other one changed.
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    expect(page.locator("section.outcome .notice.ok .state")).to_have_text("suspended")
    assert paid() == ["30"]
    rest = page.locator(f'table.answers tr[data-tool-call-id="{second}"]')
    expect(rest.locator("td.answer")).to_contain_text("Changed before it ran")
    expect(rest.locator("table.diff td.before")).to_have_text("80")
    expect(rest.locator("table.diff td.after")).to_have_text("50")
    expect(page.locator(".why-changed")).to_be_visible()
    shot(page, "payments-approved-rest-changed")
