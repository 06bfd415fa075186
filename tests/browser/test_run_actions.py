"""A run's own actions in a real browser (the fixtures are tests/support/inbox_browser.py's):
the owner finds a halted run on the Runs page, sees the grant that continuing applies,
continues it with a reason and then cancels it; an approver opens the run behind a
request from its card, reads its conversation and decides it there, with nothing else to
act on."""

from __future__ import annotations

import downstream
from inbox_browser import (
    Served,
    browser,
    halted,
    off_loop,
    own_scripts_only,
    page,
    served,
    shot,
    sign_in,
)
from playwright.sync_api import Page, expect

from tether.runs import RunState

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "halted", "page", "served"]


def test_the_owner_continues_a_halted_run_from_its_page_then_cancels_it(
    halted: tuple[Served, str], page: Page
) -> None:
    app, run_id = halted
    run = off_loop(lambda: app.engine.get_run(run_id)).run
    granted = run.limits.extended()
    sign_in(page, app)
    page.get_by_role("link", name="Runs", exact=True).click()
    row = page.locator(f"#run-{run_id}")
    expect(row).to_contain_text("halted")
    page.get_by_label("State").select_option("halted")
    page.get_by_role("button", name="Show").click()
    expect(page.locator(f"#run-{run_id}")).to_be_visible()
    shot(page, "runs-halted")
    page.locator(f"#run-{run_id} a").click()

    grant = page.locator("table.grant tr", has_text="steps")
    expect(grant.locator("td.granted")).to_have_text(str(granted.max_steps))
    expect(
        page.locator("table.grant tr", has_text="tool calls").locator("td.granted")
    ).to_have_text(str(granted.max_tool_calls))
    page.get_by_label("Reason").fill("one more step, please")
    shot(page, "run-continue-form")
    page.get_by_role("button", name="Continue", exact=True).click()
    expect(page.locator(".state")).to_have_text("running")
    expect(page.get_by_role("button", name="Continue", exact=True)).to_have_count(0)
    continued = off_loop(lambda: app.engine.get_run(run_id)).run
    assert continued.state is RunState.RUNNING and continued.limits == granted
    events = off_loop(lambda: app.engine.events(run_id))
    [grant_event] = [e.data for e in events if e.kind == "continued"]
    assert grant_event["why"] == "one more step, please" and grant_event["by"] == "dana"

    page.get_by_role("button", name="Cancel the run").click()
    expect(page.locator(".state")).to_have_text("cancelled")
    expect(page.get_by_role("button", name="Cancel the run")).to_have_count(0)
    shot(page, "run-cancelled")
    assert off_loop(lambda: app.engine.get_run(run_id)).run.state is RunState.CANCELLED
    own_scripts_only(page)


def test_an_approver_opens_the_run_behind_a_request_and_decides_it_there(
    served: Served, page: Page
) -> None:
    served.keys["boss"] = off_loop(lambda: served.engine.operator.add_user("boss"))
    run_id, _ = served.suspend()
    sign_in(page, served, "boss")
    page.locator(f"#run-{run_id}").get_by_role("link", name="Open the run").click()
    expect(page.locator(".question")).to_have_text("send b")
    expect(page.locator(".messages .role-user")).to_contain_text("send b")
    expect(page.locator(".approver-view")).to_contain_text("dana")
    for absent in ("Continue", "Cancel the run", "Fork"):
        expect(page.get_by_role("button", name=absent, exact=True)).to_have_count(0)
    expect(page.locator("table.budget")).to_have_count(0)
    shot(page, "run-as-approver")
    assert downstream.effects() == []

    page.get_by_role("button", name="Approve").click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    assert [e[1] for e in downstream.effects()] == ["send"]
    page.goto(f"{served.url}/runs/{run_id}")  # decided: no longer theirs to see
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
