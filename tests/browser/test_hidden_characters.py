"""Hidden characters in a real browser (the fixtures are tests/browser/test_inbox.py's):
a payment whose account holds U+202E (a right-to-left override that makes
``acct-1234<RLO>9876-tcca`` read as ``acct-1234acct-6789``) is shown to the approver
escaped, as ``\\u202e``, marked and with a warning, in the question, the preview, the
arguments and the edit form; the page holds no hidden character anywhere; an edit that
leaves the field as shown carries the value exactly as asked, and what is approved is
what the page showed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import agents
import pytest
from playwright.sync_api import Page, expect
from test_inbox import Served, _serving, browser, off_loop, own_scripts_only, page, shot, sign_in

from tether import Agent, ScriptedModel, StopKind, tool
from tether.visible import has_hidden

# test_inbox's fixtures, imported to be used here by name (pytest finds them in this module).
__all__ = ["browser", "page"]

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


@pytest.fixture
def payments(sqlite_url: str) -> Iterator[Served]:
    """The app for the payments agent, with dana (who asks) and boss (who decides)."""
    with _serving(sqlite_url, payments_agent(), payment_script()) as app:
        app.keys["boss"] = off_loop(lambda: app.engine.operator.add_user("boss"))
        yield app


def asked(app: Served, question: str = QUESTION) -> str:
    """dana's run suspended on its payment."""
    outcome = off_loop(lambda: app.engine.ask("dana", question))
    assert outcome.kind is StopKind.SUSPENDED
    return outcome.run_id


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
