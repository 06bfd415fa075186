"""Hidden characters in a real browser (the fixtures are tests/support/inbox_browser.py's):
a payment whose account holds U+202E (a right-to-left override that makes
``acct-1234<RLO>9876-tcca`` read as ``acct-1234acct-6789``) is shown to the approver
escaped, as ``\\u202e``, marked and with a warning, in the question, the preview, the
arguments and the edit form; the page holds no hidden character anywhere; an edit that
leaves the field as shown carries the value exactly as asked, and what is approved is
what the page showed."""

from __future__ import annotations

from inbox_browser import (
    SHOWN,
    SHOWN_QUESTION,
    SPOOF,
    Served,
    asked,
    browser,
    own_scripts_only,
    page,
    payments,
    shot,
    sign_in,
)
from playwright.sync_api import Page, expect

from tether.visible import has_hidden

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page", "payments"]


def nothing_hidden(page: Page) -> None:
    """No character on the page, in its text or in its form fields, is a hidden one."""
    assert not has_hidden(page.inner_text("body"))
    values = page.evaluate(
        "Array.from(document.querySelectorAll('input, textarea, option'), (f) => f.value)"
    )
    assert not has_hidden(values), values


def test_an_approver_sees_the_hidden_character_escaped_marked_and_warned_of(
    payments: Served, page: Page
) -> None:
    run_id = asked(payments)
    sign_in(page, payments, "boss")
    card = page.locator(f"#run-{run_id}")
    account = card.locator(".preview table.kv tr", has_text="account").locator("td")
    expect(account).to_have_text(SHOWN)
    expect(account.locator(".hidden-char")).to_have_text("\\u202e")
    expect(card.locator(".arguments .hidden-char")).to_have_text("\\u202e")
    # The question: the real override marked, the literal text typed by a person not.
    expect(card.locator(".card-question")).to_have_text(SHOWN_QUESTION)
    expect(card.locator(".card-question .hidden-char")).to_have_count(1)
    expect(card.locator(".hidden-warning").first).to_contain_text("hidden characters")
    nothing_hidden(page)
    own_scripts_only(page)
    shot(page, "hidden-inbox")

    page.goto(f"{payments.url}/approve/{payments.notifier.last(run_id).token}")
    expect(page.locator(".preview .hidden-char")).to_have_text("\\u202e")
    expect(page.locator(".hidden-warning").first).to_be_visible()
    nothing_hidden(page)
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    [decision] = payments.decisions(run_id)
    assert decision["by"] == "boss"
    assert payments.tool_result(run_id) == {"paid": SPOOF, "amount": 40}  # as shown, exactly


def test_the_edit_form_shows_the_value_escaped_and_flagged_and_carries_it_only_as_shown(
    payments: Served, page: Page
) -> None:
    run_id = asked(payments)
    sign_in(page, payments, "boss")
    card = page.locator(f"#run-{run_id}")
    card.locator("summary", has_text="Edit the arguments").click()
    field = card.get_by_label("Account")
    expect(field).to_have_value(SHOWN)
    expect(card.locator(".edit-form .hidden-warning")).to_contain_text("hidden characters")
    nothing_hidden(page)
    shot(page, "hidden-edit-form")

    # Left as shown, the field keeps the value as asked: nothing changed, still flagged.
    card.get_by_label("Amount").fill("30")
    card.get_by_role("button", name="Preview the edits").click()
    expect(page.get_by_role("heading", name="Approve the edited action?")).to_be_visible()
    rows = page.locator("table.edits tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.locator("th")).to_have_text("amount")
    expect(page.locator(".preview table.kv tr", has_text="account").locator("td")).to_have_text(
        SHOWN
    )
    expect(page.locator(".hidden-warning").first).to_be_visible()
    nothing_hidden(page)
    shot(page, "hidden-edit-kept")

    # Typed over, the field is what was typed: the escape is text, the override is gone.
    page.locator("summary", has_text="Edit the arguments").click()
    page.get_by_label("Account").fill("acct-1234-9876")
    page.get_by_role("button", name="Preview the edits").click()
    account = page.locator(".preview table.kv tr", has_text="account").locator("td")
    expect(account).to_have_text("acct-1234-9876")
    expect(page.locator("table.edits td.before .hidden-char")).to_have_text("\\u202e")
    expect(page.locator(".preview .hidden-char, .arguments .hidden-char")).to_have_count(0)
    page.get_by_role("button", name="Approve with these edits").click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    assert payments.tool_result(run_id)["result"] == {"paid": "acct-1234-9876", "amount": 30}


def test_the_owner_s_run_page_shows_every_hidden_character_escaped(
    payments: Served, page: Page
) -> None:
    run_id = asked(payments)
    sign_in(page, payments)
    page.goto(f"{payments.url}/runs/{run_id}")
    expect(page.locator("dl.facts .question")).to_have_text(SHOWN_QUESTION)
    expect(page.locator(".messages .role-user")).to_contain_text(SHOWN_QUESTION)
    expect(page.locator(".messages .role-user .hidden-char")).to_have_text("\\u202e")
    expect(page.locator(".hidden-warning").first).to_be_visible()
    nothing_hidden(page)
    shot(page, "hidden-run")
