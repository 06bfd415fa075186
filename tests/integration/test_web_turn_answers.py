"""The inbox's result pages of a turn's decisions tell what became of each call (reference
§15), in-process on both backends, with payments whose previews read the balance they
move (``payments.py``): the decide-all page, the per-call form's page and an approval
link's page each show every call the decision carried out as it was carried out, a call
re-checked ``changed`` with its diff and where to decide it again, and why it changed
when a payment before it ran; the run's page says beforehand that this can happen."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import payments
import pytest
from inbox_web import Web, csrf_of, sign_in, web

from tether import StopKind
from tether.notify import Notice

# Each row of a result page's table of calls: its call id and what became of it.
ROWS = re.compile(r'<tr data-tool-call-id="([^"]+)" data-outcome="(\w+)">')
WHY = "Why again?"


@pytest.fixture
async def pay(db_url: str) -> AsyncIterator[Web]:
    w = await web(db_url, model=payments.ByQuestion(), agent=payments.agent())
    yield w
    w.close()


async def suspended(w: Web) -> tuple[str, Notice, Notice]:
    """dana's run suspended on its two payments (30, then 20), and their notices."""
    outcome = await w.engine.ask("dana", "pay them")
    assert outcome.kind is StopKind.SUSPENDED
    first, second = (n for n in w.notifier.notices if n.run_id == outcome.run_id)
    return outcome.run_id, first, second


async def digest(w: Web, run_id: str, call_id: str) -> str:
    calls = (await w.run(run_id)).pending_calls
    return next(c.pending.digest or "" for c in calls if c.pending.tool_call_id == call_id)


async def by_form(
    w: Web, client: httpx.AsyncClient, run_id: str, notice: Notice, csrf: str
) -> httpx.Response:
    """Approve one call with its own form on the run's page."""
    shown = await digest(w, run_id, notice.tool_call_id)
    return await client.post(
        f"/runs/{run_id}/decision",
        data={
            "csrf": csrf,
            "decision": "approve",
            "tool_call_id": notice.tool_call_id,
            "digest": shown,
        },
    )


def diff_shown(page: str, before: int, after: int) -> bool:
    return f'<td class="before">{before}</td>' in page and f'<td class="after">{after}</td>' in page


async def test_approve_all_shows_the_first_payment_carried_out_and_the_second_changed(
    pay: Web,
) -> None:
    run_id, first, second = await suspended(pay)
    async with pay.client() as client:
        await sign_in(client, pay.keys["dana"])
        page = await client.get(f"/runs/{run_id}")
        assert 'class="muted turn-order"' in page.text  # said before anything is decided
        form = {"csrf": csrf_of(page.text), "all": "approve"}
        for n, notice in enumerate((first, second)):
            form[f"call.{n}"] = notice.tool_call_id
            form[f"digest.{n}"] = await digest(pay, run_id, notice.tool_call_id)
        done = await client.post(f"/runs/{run_id}/decisions", data=form)
    assert done.status_code == 200
    assert ROWS.findall(done.text) == [
        (first.tool_call_id, "executed"),
        (second.tool_call_id, "changed"),
    ]
    assert "the turn was carried out in the order asked" not in done.text
    assert "Not everything could be carried out" in done.text
    assert 'pay</code> <span class="muted">{&#34;amount&#34;: 30}' in done.text
    assert diff_shown(done.text, 80, 50) and WHY in done.text
    assert f'href="/runs/{run_id}" class="decide-again"' in done.text


async def test_the_last_form_shows_the_payment_it_carried_out_before_its_own_changed(
    pay: Web,
) -> None:
    run_id, first, second = await suspended(pay)
    async with pay.client() as client:
        await sign_in(client, pay.keys["dana"])
        csrf = csrf_of((await client.get(f"/runs/{run_id}")).text)
        assert (await by_form(pay, client, run_id, first, csrf)).status_code == 200
        last = await by_form(pay, client, run_id, second, csrf)
    assert last.status_code == 409 and "<h1>The details changed</h1>" in last.text
    assert "Nothing was done" not in last.text  # the first payment was made
    assert "Carried out before it" in last.text
    assert ROWS.findall(last.text) == [(first.tool_call_id, "executed")]
    assert diff_shown(last.text, 80, 50) and WHY in last.text


async def test_the_last_form_shows_a_later_payment_changed_after_its_own_was_made(
    pay: Web,
) -> None:
    run_id, first, second = await suspended(pay)
    async with pay.client() as client:
        await sign_in(client, pay.keys["dana"])
        csrf = csrf_of((await client.get(f"/runs/{run_id}")).text)
        assert (await by_form(pay, client, run_id, second, csrf)).status_code == 200
        last = await by_form(pay, client, run_id, first, csrf)
    assert last.status_code == 200 and "<h1>Approved</h1>" in last.text
    assert "The rest of the turn" in last.text
    assert ROWS.findall(last.text) == [(second.tool_call_id, "changed")]
    assert diff_shown(last.text, 80, 50) and WHY in last.text
    assert "Review it and decide again" in last.text


async def test_an_approval_link_shows_the_payment_its_decision_carried_out(pay: Web) -> None:
    _, first, second = await suspended(pay)
    await pay.engine.resume_after_confirmation(first.token, "approve", "dana")
    async with pay.client() as client:
        await sign_in(client, pay.keys["dana"])
        link = await client.get(f"/approve/{second.token}")
        last = await client.post(
            f"/approve/{second.token}", data={"csrf": csrf_of(link.text), "decision": "approve"}
        )
    assert last.status_code == 409 and "Carried out before it" in last.text
    assert ROWS.findall(last.text) == [(first.tool_call_id, "executed")]
    assert "{&#34;amount&#34;: 30}" in last.text  # the action, found through the used token


async def test_a_payment_changed_by_the_world_first_shows_no_turn_explanation(pay: Web) -> None:
    run_id, first, second = await suspended(pay)
    payments.pay_outside(5)
    async with pay.client() as client:
        await sign_in(client, pay.keys["dana"])
        csrf = csrf_of((await client.get(f"/runs/{run_id}")).text)
        await by_form(pay, client, run_id, first, csrf)
        last = await by_form(pay, client, run_id, second, csrf)
    # The last decider's own payment was not reached: recorded, and the first changed.
    assert last.status_code == 200 and "<h1>Recorded</h1>" in last.text
    assert ROWS.findall(last.text) == [(first.tool_call_id, "changed")]
    assert diff_shown(last.text, 70, 65)
    assert WHY not in last.text  # nothing of the turn ran before it: the world moved
