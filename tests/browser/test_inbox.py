"""The inbox in a real browser: Playwright drives Debian's Chromium against the app served
by uvicorn on a loopback port. Sign in, see the request, approve it with a double click
(it resumes once, by the store), see a changed request's diff side by side, and fork a
halted run from its page.

Chromium comes from the system (``apt-get install chromium``; CI does it); Playwright's
own browser download is never used. Without /usr/bin/chromium this test fails."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal

import agents
import downstream
import pytest
from inbox_browser import (
    Served,
    browser,
    halted,
    off_loop,
    own_scripts_only,
    page,
    served,
    serving,
    shot,
    sign_in,
)
from playwright.sync_api import Page, expect
from waiting import poll_until

from tether import Agent, ScriptedModel, tool

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "halted", "page", "served"]


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
    with serving(sqlite_url, agent, model) as app:
        yield app


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


def test_the_inbox_pages_by_its_next_link_and_the_requests_decided_meanwhile_shift_nothing(
    served: Served, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of the inbox says how many more wait and links the next by a cursor (its
    last request), so deciding a request of the first page moves nothing on the next."""
    monkeypatch.setattr("tether.api.web.inbox.INBOX_LIMIT", 2)
    runs = [served.suspend()[0] for _ in range(3)]
    sign_in(page, served)
    expect(page.locator("p.more")).to_contain_text("1 more waiting")
    listed = page.get_by_role("link", name="Open the run").evaluate_all(
        "(links) => links.map((a) => a.getAttribute('href'))"
    )
    assert listed == [f"/runs/{run}" for run in runs[:2]]
    shot(page, "inbox-first-page")
    first = page.locator("p.more a[rel=next]").get_attribute("href")
    assert first is not None and first.startswith("/?after=")
    token = served.notifier.last(runs[0]).token  # the first page's first request, decided
    off_loop(lambda: served.engine.resume_after_confirmation(token, "approve", "dana"))
    # The link as the page showed it (the live page may since have redrawn without it).
    page.goto(served.url + first)
    expect(page.locator("p.more")).to_have_count(0)
    opened = page.get_by_role("link", name="Open the run").evaluate_all(
        "(links) => links.map((a) => a.getAttribute('href'))"
    )
    assert opened == [f"/runs/{runs[2]}"]
    shot(page, "inbox-next-page")
    page.goto("about:blank")  # the inbox's live stream ends before the server stops
