"""Who decides, in a real browser (reference §19; the fixtures are tests/support/
inbox_browser.py's, the agent tests/support/deciders.py's): a payment that waits on two
approvals, approved by two people each from their own signed-in session. The first sees
their approval recorded as 1 of 2, the request still waiting with their name under its
approvals and no Approve button for them, and an approval sent again from a page left open
has a page of its own; the second, from the approval link, sees who approved and who may
still, and their approval carries the payment out once. And a call escalated to the
on-call group shows in its member's inbox, marked escalated, and they decide it there."""

from __future__ import annotations

from collections.abc import Iterator

import deciders
import downstream
import pytest
from inbox_browser import Served, browser, off_loop, own_scripts_only, page, serving, shot, sign_in
from playwright.sync_api import Browser, Page, expect
from waiting import poll_until

from tether import StopKind

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page"]


def _app(url: str, tool: str, people: tuple[str, ...]) -> Iterator[Served]:
    """The app for the deciders' agent whose model calls ``tool``, with keys for ``people``
    (ann and bob in the finance group, olga on call)."""
    deciders.finance()
    deciders.join("olga", "oncall")
    with serving(url, deciders.agent(), deciders.script(tool)) as app:
        for name in people:
            app.keys[name] = _user(app, name)
        yield app


def _user(app: Served, name: str) -> str:
    """The key of a new user ``name``."""
    return off_loop(lambda: app.engine.operator.add_user(name))


@pytest.fixture
def paying(sqlite_url: str) -> Iterator[Served]:
    yield from _app(sqlite_url, "pay", ("boss", "ann"))


@pytest.fixture
def wiring(sqlite_url: str) -> Iterator[Served]:
    yield from _app(sqlite_url, "wire", ("boss", "ann"))


@pytest.fixture
def paging(sqlite_url: str) -> Iterator[Served]:
    yield from _app(sqlite_url, "page", ("olga",))


def person(browser: Browser, app: Served, who: str) -> Page:
    """A page of ``who``'s own signed-in session."""
    page = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
    sign_in(page, app, who)
    return page


def suspended(app: Served) -> tuple[str, str]:
    """dana's run suspended on its one call, and the call's token."""
    outcome = off_loop(lambda: app.engine.ask(deciders.OWNER, "Pay acct-0 its 500"))
    assert outcome.kind is StopKind.SUSPENDED
    return outcome.run_id, app.notifier.last(outcome.run_id).token


def test_two_people_approve_a_payment_each_from_their_own_session_and_it_runs_once(
    paying: Served, page: Page, browser: Browser
) -> None:
    run_id, token = suspended(paying)
    sign_in(page, paying, "boss")
    card = page.locator(f"#run-{run_id}")
    expect(card.locator(".approvals-badge")).to_have_text("0 of 2 approvals")
    expect(card.locator(".still-names")).to_have_text(
        "dana (who asked), boss (you) or anyone in group finance"
    )
    shot(page, "quorum-inbox-before")
    # boss's own session in another window, with his approval link left open in it
    tabs = browser.new_context(
        viewport={"width": 1100, "height": 900}, storage_state=page.context.storage_state()
    )
    stale = tabs.new_page()
    stale.goto(f"{paying.url}/approve/{token}")
    card.get_by_role("button", name="Approve", exact=True).click()

    expect(page.locator(".quorum-recorded")).to_contain_text("Your approval is recorded: 1 of 2")
    shot(page, "quorum-recorded")
    assert downstream.effects() == []
    page.goto(f"{paying.url}/")
    expect(card.locator(".you-approved")).to_contain_text(
        "You approved this; waiting for 1 more approval."
    )
    expect(card.locator(".approval .by")).to_have_text("boss")
    expect(card.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    expect(card.get_by_role("button", name="Decline", exact=True)).to_be_visible()
    own_scripts_only(page)
    shot(page, "quorum-inbox-approved")
    again = tabs.new_page()  # the link opened again now
    again.goto(f"{paying.url}/approve/{token}")
    expect(again.locator("h1")).to_have_text("Waiting for more approvals")
    shot(again, "quorum-link-approved")
    again.close()
    stale.bring_to_front()  # the page left open, with its Approve button
    stale.get_by_role("button", name="Approve", exact=True).click()
    expect(stale.locator("section.outcome h1")).to_have_text("You already approved this")
    shot(stale, "quorum-already-decided")
    tabs.close()

    ann = person(browser, paying, "ann")
    ann.goto(f"{paying.url}/approve/{token}")
    expect(ann.locator(".quorum")).to_contain_text("2 approvals needed · 1 so far")
    expect(ann.locator(".approval .by")).to_have_text("boss")
    expect(ann.locator(".still-names")).to_have_text("dana (who asked) or anyone in group finance")
    shot(ann, "quorum-approval-page")
    ann.get_by_role("button", name="Approve", exact=True).click()
    expect(ann.locator("section.outcome h1")).to_have_text("Approved")
    shot(ann, "quorum-executed")
    ann.context.close()
    poll_until(lambda: len(downstream.effects()) == 1, what="the payment")
    assert [item for _, _, item in downstream.effects()] == ["acct-0:500"]


def test_a_call_escalated_to_the_on_call_group_is_decided_from_its_member_s_inbox(
    paging: Served, page: Page
) -> None:
    run_id, _ = suspended(paging)
    sign_in(page, paging, "olga")
    expect(page.locator(".empty")).to_have_text("Nothing is waiting for you.")

    def escalated() -> bool:
        off_loop(paging.engine.operator.reap)
        events = off_loop(lambda: paging.engine.events(run_id))
        return any(e.kind == "escalated" for e in events)

    poll_until(escalated, what="the escalation")
    page.goto(f"{paging.url}/")
    card = page.locator(f"#run-{run_id}")
    expect(card.locator(".card-head .escalated")).to_have_text("Escalated")
    expect(card.locator(".escalated-to")).to_have_text("lead and anyone in group oncall")
    shot(page, "escalated-inbox")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    assert [item for _, _, item in downstream.effects()] == ["acct-0:500"]


def test_the_owner_waits_for_two_others_and_an_edit_starts_a_new_round(
    wiring: Served, page: Page, browser: Browser
) -> None:
    run_id, token = suspended(wiring)
    sign_in(page, wiring, "dana")
    page.goto(f"{wiring.url}/runs/{run_id}")
    expect(page.locator(".waiting")).to_contain_text("Waiting for someone else")
    expect(page.locator(".quorum")).to_contain_text("2 approvals needed · 0 so far")
    expect(page.locator(".still-names")).to_have_text("boss or anyone in group finance")
    shot(page, "quorum-four-eyes-owner")

    boss = person(browser, wiring, "boss")
    boss.goto(f"{wiring.url}/approve/{token}")
    boss.get_by_role("button", name="Approve", exact=True).click()
    expect(boss.locator(".quorum-recorded")).to_contain_text("1 of 2")

    ann = person(browser, wiring, "ann")
    ann.goto(f"{wiring.url}/approve/{token}")
    ann.locator("details.edit summary").click()
    ann.get_by_label("Amount").fill("450")
    ann.get_by_role("button", name="Preview the edits").click()
    expect(ann.locator(".new-round")).to_contain_text("the 1 approval so far no longer counts")
    shot(ann, "quorum-new-round-preview")
    ann.get_by_role("button", name="Approve with these edits").click()
    expect(ann.locator(".quorum-recorded")).to_contain_text("Your edit started a new round")
    shot(ann, "quorum-new-round-recorded")

    boss.goto(f"{wiring.url}/approve/{token}")  # his approval was of the request as it was
    expect(boss.locator(".approval .by")).to_have_text("ann")
    boss.get_by_role("button", name="Approve", exact=True).click()
    expect(boss.locator("section.outcome h1")).to_have_text("Approved")
    assert [item for _, _, item in downstream.effects()] == ["acct-0:450"]
