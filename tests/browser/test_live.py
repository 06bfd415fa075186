"""The inbox follows a run live in a real browser (reference §16; the fixtures are
tests/support/inbox_browser.py's): a run's page opened before the run is carried shows the
model's text growing as it is written, then the approval form, without a reload; the
list of runs shows a run's new state without a reload. A marker the test sets on the
loaded page stays there: the page was never loaded again."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import agents
import downstream
import processes
import pytest
from inbox_browser import Served, browser, off_loop, own_scripts_only, page, serving, shot, sign_in
from playwright.sync_api import Page, expect
from waiting import run_sync

from tether import Outcome, ScriptedModel, StopKind

# The fixtures of tests/support/inbox_browser.py this module uses (pytest finds them here).
__all__ = ["browser", "page"]

TEXT = agents.SCRIPTS["streamed_send"][0]["content"]
# Pieces of 4 code points, one every 50 ms: the page has a couple of seconds of writing.
PACE = {"chunk_chars": 4, "delay_s": 0.05}

# Records the length (in code points) of the text being written, at each change.
RECORD_LENGTHS = """() => {
  window.lengths = [];
  const shown = document.querySelector("[data-live-text] pre");
  new MutationObserver(() => window.lengths.push(Array.from(shown.textContent).length))
    .observe(shown, { childList: true, characterData: true, subtree: true });
}"""
GREW = "(total) => new Set(window.lengths.filter((n) => n > 0 && n < total)).size >= 2"
FETCHED = "(n) => Number(document.querySelector('.live-follow').dataset.liveFetched || 0) > n"


@pytest.fixture
def paced(sqlite_url: str) -> Iterator[Served]:
    """The app for the test agent, whose model writes a turn of text slowly, then asks
    for a ``send`` a human confirms."""
    model = ScriptedModel(agents.SCRIPTS["streamed_send"], stream=PACE)
    with serving(sqlite_url, agents.agent(), model) as app:
        yield app


def carry(app: Served, run_id: str, pool: ThreadPoolExecutor) -> Future[Outcome]:
    """Carry the run to its next stop on a thread of its own, while the test drives the
    browser."""
    return pool.submit(lambda: run_sync(app.engine.run_until_stop(run_id)))


def mark_loaded(page: Page) -> None:
    """A marker on the loaded page: a reload would lose it."""
    page.evaluate("window.loadedOnce = true")


def test_a_run_s_page_shows_the_text_as_it_is_written_then_the_form_without_a_reload(
    paced: Served, page: Page
) -> None:
    run = off_loop(lambda: paced.engine.start_run("dana", "send it"))
    sign_in(page, paced)
    page.goto(f"{paced.url}/runs/{run.id}")
    expect(page.locator("dl.facts .state")).to_have_text("running")
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "open")
    expect(page.locator("form.decide")).to_have_count(0)
    own_scripts_only(page)
    mark_loaded(page)
    page.evaluate(RECORD_LENGTHS)

    with ThreadPoolExecutor(max_workers=1) as pool:
        carried = carry(paced, run.id, pool)
        page.wait_for_function(GREW, arg=len(TEXT))  # two lengths short of the whole text
        shot(page, "live-text")
        expect(page.locator("dl.facts .state")).to_have_text("suspended")
        assert carried.result(timeout=60).kind is StopKind.SUSPENDED
    form = page.locator("form.decide")
    expect(form.get_by_role("button", name="Approve")).to_be_visible()
    expect(page.locator(".messages .role-assistant")).to_contain_text(TEXT.strip())
    expect(page.locator("[data-live-text]")).to_be_hidden()  # the stored turn holds it
    expect(page.locator("table.timeline")).to_contain_text("suspended")
    assert page.evaluate("window.loadedOnce") is True
    shot(page, "live-suspended")

    form.get_by_role("button", name="Approve").click()  # a plain form, as without a script
    expect(page.locator("section.outcome h1")).to_have_text("Approved")
    assert [e[1] for e in downstream.effects()] == ["send"]


def test_the_list_of_runs_shows_a_run_s_new_state_without_a_reload(
    paced: Served, page: Page
) -> None:
    run = off_loop(lambda: paced.engine.start_run("dana", "send it"))
    sign_in(page, paced)
    page.get_by_role("link", name="Runs", exact=True).click()
    row = page.locator(f"#run-{run.id}")
    expect(row).to_contain_text("running")
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "open")
    mark_loaded(page)

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert carry(paced, run.id, pool).result(timeout=60).kind is StopKind.SUSPENDED
    expect(row.locator(".state")).to_have_text("suspended")
    off_loop(lambda: paced.engine.cancel_run(run.id, "dana"))
    expect(row.locator(".state")).to_have_text("cancelled")
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "closed")
    assert page.evaluate("window.loadedOnce") is True
    shot(page, "live-runs")


def fetched(page: Page) -> int:
    """How many times the page's script has fetched the page again."""
    return int(page.locator(".live-follow").get_attribute("data-live-fetched") or 0)


def test_a_part_being_typed_in_is_left_alone_until_it_is_free_again(
    paced: Served, page: Page
) -> None:
    first, _ = paced.suspend()
    second, _ = paced.suspend()
    sign_in(page, paced)
    expect(page.locator(".live-follow")).to_have_attribute("data-live-state", "open")
    reason = page.locator(f"#run-{first}").get_by_label("Reason")
    reason.fill("typed, not sent")
    mark_loaded(page)

    before = fetched(page)
    off_loop(lambda: paced.engine.cancel_run(second, "dana"))
    page.wait_for_function(FETCHED, arg=before)  # the page was fetched again ...
    expect(reason).to_have_value("typed, not sent")  # ... and what is typed stays
    expect(page.locator(f"#run-{second}")).to_be_visible()

    reason.fill("")
    page.locator("h1").click()  # nothing typed, nothing focused: the part is free
    off_loop(lambda: paced.engine.cancel_run(first, "dana"))
    expect(page.locator(f"#run-{second}")).to_have_count(0)
    expect(page.locator(f"#run-{first}")).to_have_count(0)
    expect(page.locator(".empty")).to_have_text("Nothing is waiting for you.")
    assert page.evaluate("window.loadedOnce") is True


def _docs_client() -> str:
    """The fetch-based client of docs/integrations.md, as written there."""
    page = (processes.ROOT / "docs" / "integrations.md").read_text()
    start = page.index("// follow.js")
    return page[start : page.index("```", start)]


FOLLOW = """({ runId, key, client }) => {
  window.texts = [];
  window.kinds = [];
  const follow = new Function(`${client}; return follow;`)();
  window.followed = follow(
    "", runId, key,
    (step, text) => window.texts.push([step, Array.from(text).length, text]),
    (event) => window.kinds.push(event.kind),
  ).then(() => "returned");
}"""
GREW_IN_CLIENT = """(total) => new Set(
  window.texts.filter(([step, n]) => step === 1 && n > 0 && n < total).map(([, n]) => n)
).size >= 2"""


def test_the_integrations_page_s_browser_client_renders_the_text_as_it_streams(
    paced: Served, page: Page
) -> None:
    """docs/integrations.md's ``follow`` with an API key (no session): in Chromium it gets
    the text growing, the stored events, and returns once the run is terminal."""
    run = off_loop(lambda: paced.engine.start_run("dana", "send it"))
    page.goto(f"{paced.url}/healthz")  # the API's origin, as the page the docs have in mind
    client = {"runId": run.id, "key": paced.keys["dana"], "client": _docs_client()}
    page.evaluate(FOLLOW, client)
    page.wait_for_function("() => window.kinds.includes('created')")
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert carry(paced, run.id, pool).result(timeout=60).kind is StopKind.SUSPENDED
    page.wait_for_function("() => window.kinds.includes('suspended')")
    assert page.evaluate(GREW_IN_CLIENT, len(TEXT)), page.evaluate("window.texts")
    off_loop(lambda: paced.engine.cancel_run(run.id, "dana"))
    assert page.evaluate("window.followed") == "returned"
    texts = page.evaluate("window.texts")
    assert [t for step, _, t in texts if step == 1][-1] == TEXT
    kinds = page.evaluate("window.kinds")
    assert kinds[0] == "created" and kinds[-1] == "cancelled" and "model_turn" in kinds
