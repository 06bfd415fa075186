"""What a person reads on the inbox's pages, in a real browser (the fixtures are
tests/support/inbox_browser.py's): every card says which run's question it serves, the runs
page leads with the question, the timeline says what happened in words (its raw data
folded away), a queued or cancelled run reads as what it is, and every page that answers
a decision leads back to the run."""

from __future__ import annotations

import re

import downstream
from inbox_browser import (
    Served,
    asked,
    browser,
    halted,
    off_loop,
    page,
    payments,
    served,
    shot,
    sign_in,
)
from playwright.sync_api import Locator, Page, expect

from tether.runs import RunState

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "halted", "page", "payments", "served"]

MARCH = "Pay the March invoice of Henderson"
APRIL = "Pay the April invoice of Alvarez"


def state_of(page: Page) -> Locator:
    """What a run's page says after "State"."""
    return page.locator("dl.facts dt", has_text="State").locator("xpath=following-sibling::dd[1]")


def test_every_card_shows_the_question_of_its_run(payments: Served, page: Page) -> None:
    first, second = asked(payments, MARCH), asked(payments, APRIL)
    sign_in(page, payments, "boss")
    expect(page.locator(f"#run-{first} .card-question")).to_have_text(MARCH)
    expect(page.locator(f"#run-{second} .card-question")).to_have_text(APRIL)
    shot(page, "inbox-questions")
    page.goto(f"{payments.url}/approve/{payments.notifier.last(second).token}")
    expect(page.locator("section.card .card-question")).to_have_text(APRIL)


def test_the_runs_page_leads_with_the_question_and_keeps_the_id_short(
    payments: Served, page: Page
) -> None:
    run_id = asked(payments, MARCH)
    sign_in(page, payments)
    page.get_by_role("link", name="Runs", exact=True).click()
    row = page.locator(f"#run-{run_id}")
    expect(row.locator("td").first).to_contain_text(MARCH)
    expect(row).to_contain_text(run_id[:8])
    assert run_id not in row.inner_text()  # the whole id is not what a person reads
    cell, table = row.locator("td").first.bounding_box(), page.locator("table.runs").bounding_box()
    assert cell is not None and table is not None and cell["width"] > table["width"] / 2
    shot(page, "runs-readable")
    row.get_by_role("link", name=MARCH).click()
    expect(page).to_have_url(f"{payments.url}/runs/{run_id}")


def test_the_timeline_says_what_happened_and_folds_its_raw_data(
    payments: Served, page: Page
) -> None:
    run_id = asked(payments, MARCH)
    token = payments.notifier.last(run_id).token
    off_loop(lambda: payments.engine.resume_after_confirmation(token, "approve", "boss"))
    assert off_loop(lambda: payments.engine.run_until_stop(run_id)).kind.value == "answered"
    sign_in(page, payments)
    page.goto(f"{payments.url}/runs/{run_id}")
    timeline = page.locator("table.timeline")
    for said in ("Asked by dana", "Waiting for a decision on pay", "Approved by boss", "Answered"):
        expect(timeline).to_contain_text(said, use_inner_text=True)
    expect(timeline.locator("tr", has_text="Model turn 1")).to_contain_text("1,000 tokens in")
    # Which model wrote each turn (reference §21): the engine's one model here.
    model = payments.engine.runner.services.model.name
    expect(timeline.locator("tr", has_text="Model turn 1")).to_contain_text(f"by {model}")
    assert '{"' not in timeline.inner_text()  # no raw JSON is what a person reads
    row = timeline.locator("tbody tr", has_text="Approved by boss")
    raw = row.locator("details pre")
    expect(raw).to_be_hidden()
    shot(page, "timeline-readable")
    row.locator("details summary").click()
    expect(raw).to_be_visible()
    expect(raw).to_contain_text('"by": "boss"')


def test_a_queued_run_reads_queued_with_its_start_time_never_started(
    payments: Served, page: Page
) -> None:
    run = off_loop(
        lambda: payments.engine.start_run("dana", "Pay it in 2030", start_at="2030-01-01T00:00Z")
    )
    assert run.state is RunState.QUEUED
    sign_in(page, payments)
    page.goto(f"{payments.url}/runs/{run.id}")
    state = state_of(page)
    expect(state.locator(".state")).to_have_text("queued")
    expect(state).to_contain_text("starts at 2030-01-01 00:00:00 UTC")
    expect(page.locator("dl.facts")).not_to_contain_text("Started")
    shot(page, "run-queued")
    page.goto(f"{payments.url}/runs")
    expect(page.locator(f"#run-{run.id}")).to_contain_text("starts at 2030-01-01 00:00:00 UTC")
    expect(page.locator("table.runs thead")).not_to_contain_text("Started")


def test_a_cancelled_run_says_who_cancelled_it_and_no_halt_reason(
    halted: tuple[Served, str], page: Page
) -> None:
    app, run_id = halted
    sign_in(page, app)
    page.goto(f"{app.url}/runs/{run_id}")
    state = state_of(page)
    expect(state).to_contain_text("max_steps")  # halted: why is said
    page.get_by_role("button", name="Cancel the run").click()
    expect(state.locator(".state")).to_have_text("cancelled")
    expect(state).to_contain_text("by dana")
    expect(state).not_to_contain_text("max_steps")
    shot(page, "run-cancelled-words")
    page.goto(f"{app.url}/runs")
    expect(page.locator(f"#run-{run_id}")).not_to_contain_text("max_steps")


def back_to_the_run(page: Page, app: Served, run_id: str) -> None:
    page.get_by_role("link", name="Back to the run").click()
    expect(page).to_have_url(f"{app.url}/runs/{run_id}")


def test_every_page_that_answers_a_decision_leads_back_to_the_run(
    served: Served, page: Page
) -> None:
    sign_in(page, served)
    pages = [
        ("Approved", None),
        ("Declined", None),
        ("The details changed", "price"),
        ("Refused by a check", "hold"),
    ]
    for heading, world in pages:
        run_id, token = served.suspend()
        page.goto(f"{served.url}/approve/{token}")
        if world == "price":
            downstream.set_world("price", "90")
        elif world == "hold":
            downstream.set_world("hold", "1")
        button = "Decline" if heading == "Declined" else "Approve"
        page.get_by_role("button", name=button, exact=True).click()
        expect(page.locator("section.outcome h1")).to_have_text(heading)
        shot(page, "result-" + re.sub(r"\W+", "-", heading.lower()))
        back_to_the_run(page, served, run_id)
        downstream.set_world("price", "100")
        downstream.set_world("hold", "0")


def test_an_approver_s_result_page_names_the_run_it_decided(payments: Served, page: Page) -> None:
    run_id = asked(payments, MARCH)
    sign_in(page, payments, "boss")
    page.locator(f"#run-{run_id}").get_by_role("button", name="Approve", exact=True).click()
    outcome = page.locator("section.outcome")
    expect(outcome.locator("h1")).to_have_text("Approved")
    expect(outcome.locator(".outcome-run")).to_contain_text(MARCH)
    expect(outcome.locator(".outcome-run")).to_contain_text("dana")
    # Nothing in the run waits for boss any more: its page is dana's alone, so no dead link.
    expect(page.get_by_role("link", name="Back to the run")).to_have_count(0)
    shot(page, "result-approver")
