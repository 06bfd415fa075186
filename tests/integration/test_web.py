"""The inbox pages in-process on both backends: GET never acts, only a signed-in POST with
the session's CSRF token does, strangers learn nothing, and stored text is escaped."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import agents
import downstream
import httpx
import pytest
from inbox_web import Web, csrf_of, session_csrf, sign_in, try_sign_in
from inbox_web import web as _web

import tether.api.web.inbox
from tether import Agent, ScriptedModel
from tether.runs import RunState

FORM_ACTION = re.compile(r'action="/approve/([^"]+)"')


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    w = await _web(db_url)
    yield w
    w.engine.close()


async def test_opening_an_approval_link_changes_nothing(web: Web) -> None:
    run_id, token = await web.suspended()
    before = await web.run(run_id)
    async with web.client() as anonymous:
        prompt = await anonymous.get(f"/approve/{token}")
    assert prompt.status_code == 200 and "Sign in to review" in prompt.text
    assert "dana" not in prompt.text and "<code>send</code>" not in prompt.text
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        for _ in range(3):
            shown = await client.get(f"/approve/{token}")
            assert shown.status_code == 200
            assert "<code>send</code>" in shown.text and ">100<" in shown.text
            assert 'value="approve"' in shown.text and "left" in shown.text
    after = await web.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
    assert await web.decisions(run_id) == [] and downstream.effects() == []
    result = await web.engine.resume_after_confirmation(token, "approve", "dana")
    assert result.ok  # the token survived every GET


async def test_a_post_without_the_session_csrf_token_changes_nothing(web: Web) -> None:
    run_id, token = await web.suspended()
    before = await web.run(run_id)
    async with web.client() as anonymous:
        refused = await anonymous.post(f"/approve/{token}", data={"decision": "approve"})
        assert refused.status_code == 403
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        missing = await client.post(f"/approve/{token}", data={"decision": "approve"})
        forged = await client.post(
            f"/approve/{token}", data={"decision": "approve", "csrf": "0" * 64}
        )
        cross_site = await client.post(
            f"/approve/{token}",
            data={"decision": "approve", "csrf": await session_csrf(client)},
            headers={"Sec-Fetch-Site": "cross-site"},
        )
    assert [r.status_code for r in (missing, forged, cross_site)] == [403, 403, 403]
    assert all("Nothing was done" in r.text for r in (missing, forged, cross_site))
    after = await web.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
    assert await web.decisions(run_id) == [] and downstream.effects() == []


async def test_a_csrf_token_of_another_session_is_refused(web: Web) -> None:
    run_id, token = await web.suspended()
    async with web.client() as other:
        await sign_in(other, web.keys["dana"])
        stolen = await session_csrf(other)
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        refused = await client.post(
            f"/approve/{token}", data={"decision": "approve", "csrf": stolen}
        )
    assert refused.status_code == 403
    assert (await web.run(run_id)).state is RunState.SUSPENDED and downstream.effects() == []


async def test_a_user_who_may_not_approve_sees_unknown_or_expired_and_changes_nothing(
    web: Web,
) -> None:
    run_id, token = await web.suspended()
    before = await web.run(run_id)
    async with web.client() as client:
        await sign_in(client, web.keys["eve"])
        shown = await client.get(f"/approve/{token}")
        acted = await client.post(
            f"/approve/{token}", data={"decision": "approve", "csrf": await session_csrf(client)}
        )
        foreign_run = await client.get(f"/runs/{run_id}")
        inbox = await client.get("/")
    for response in (shown, acted):
        assert response.status_code == 404 and "unknown or has expired" in response.text
        assert "dana" not in response.text and "<code>send</code>" not in response.text
    assert foreign_run.status_code == 404 and "dana" not in foreign_run.text
    assert run_id not in inbox.text and "Nothing is waiting" in inbox.text
    after = await web.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
    assert await web.decisions(run_id) == [] and downstream.effects() == []


async def test_an_unknown_token_is_unknown_or_expired(web: Web) -> None:
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        shown = await client.get("/approve/not-a-token")
        acted = await client.post(
            "/approve/not-a-token", data={"decision": "approve", "csrf": await session_csrf(client)}
        )
    assert shown.status_code == acted.status_code == 404
    assert "unknown or has expired" in shown.text and "unknown or has expired" in acted.text


async def test_approving_acts_once_and_a_second_post_shows_who_decided(web: Web) -> None:
    run_id, token = await web.suspended()
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = await session_csrf(client)
        first = await client.post(f"/approve/{token}", data={"decision": "approve", "csrf": csrf})
        second = await client.post(f"/approve/{token}", data={"decision": "decline", "csrf": csrf})
        reopened = await client.get(f"/approve/{token}")
    assert first.status_code == 200 and "Approved" in first.text
    assert second.status_code == 409 and "Already decided" in second.text
    for page in (second, reopened):
        assert '<dd class="decision">approve</dd>' in page.text and "<dd>dana</dd>" in page.text
        assert " UTC</dd>" in page.text
    assert [e[1] for e in downstream.effects()] == ["send"]
    assert [d["decision"] for d in await web.decisions(run_id)] == ["approve"]


async def test_an_approval_past_the_owners_cap_says_it_waits_for_a_slot(web: Web) -> None:
    run_id, token = await web.suspended()
    other = await web.engine.start_run("dana", "send b")
    object.__setattr__(web.engine.runner.services.settings, "max_active_per_user", 1)
    assert web.engine.runner.store.claim_ready("elsewhere", other.id, cap=1) is not None
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = await session_csrf(client)
        page = await client.post(f"/approve/{token}", data={"decision": "approve", "csrf": csrf})
    assert page.status_code == 200 and "Recorded" in page.text
    assert "recorded held" in page.text and "waits for one of them to end" in page.text
    assert downstream.effects() == []  # nothing carried out yet
    assert [d["decision"] for d in await web.decisions(run_id)] == ["approve"]


async def test_an_allowed_approver_sees_the_request_in_the_inbox_and_decides_it(web: Web) -> None:
    run_id, token = await web.suspended()
    async with web.client() as client:
        await sign_in(client, web.keys["boss"])
        inbox = await client.get("/")
        assert f'id="run-{run_id}"' in inbox.text and ">100<" in inbox.text
        assert f'href="/runs/{run_id}"' in inbox.text  # the run behind the request, read-only
        declined = await client.post(
            f"/approve/{token}", data={"decision": "decline", "csrf": csrf_of(inbox.text)}
        )
        after = await client.get("/")
    assert declined.status_code == 200 and "Declined" in declined.text
    assert run_id not in after.text
    assert downstream.effects() == []
    assert [(d["decision"], d["by"]) for d in await web.decisions(run_id)] == [("decline", "boss")]


async def test_the_owners_inbox_lists_the_request_with_its_preview_and_time_left(
    web: Web,
) -> None:
    run_id, _ = await web.suspended()
    async with web.client() as client:
        anonymous = await client.get("/")
        assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login?next=/"
        await sign_in(client, web.keys["dana"])
        inbox = await client.get("/")
    assert inbox.status_code == 200
    assert f'href="/runs/{run_id}"' in inbox.text
    assert '<th scope="row">price</th><td>100</td>' in inbox.text
    assert re.search(r"\d+ min \d+ s left", inbox.text)


async def test_the_inbox_finds_a_request_behind_newer_finished_runs(
    web: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting, _ = await web.suspended()
    for _ in range(3):
        newer, _ = await web.suspended()
        await web.engine.cancel_run(newer, "dana")
    monkeypatch.setattr(tether.api.web.inbox, "INBOX_LIMIT", 2)
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        inbox = await client.get("/")
    assert re.findall(r'href="/runs/([^"]+)"', inbox.text) == [waiting]


def cards(page: str) -> list[str]:
    """The runs whose requests an inbox page shows, in order."""
    return re.findall(r'<article class="card pending" id="run-([^"]+)"', page)


async def test_another_users_many_requests_hide_none_of_mine_and_the_inbox_pages_the_rest(
    web: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    danas = [(await web.suspended())[0] for _ in range(3)]
    mine, _ = await web.suspended(user="eve")  # eve may decide only her own
    monkeypatch.setattr(tether.api.web.inbox, "INBOX_LIMIT", 2)
    async with web.client() as client:
        await sign_in(client, web.keys["eve"])
        eves = await client.get("/")
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        first = await client.get("/")
        link = re.search(r'href="(/\?after=[^"]+)" rel="next"', first.text)
        assert link is not None
        second = await client.get(html.unescape(link.group(1)))
        bad = await client.get("/?after=-1")
    assert cards(eves.text) == [mine] and "more waiting" not in eves.text
    assert cards(first.text) == danas[:2]
    assert "1 more waiting" in first.text
    assert cards(second.text) == danas[2:]
    assert "more waiting" not in second.text
    assert bad.status_code == 422


async def test_a_changed_preview_shows_the_diff_side_by_side_and_the_new_form_works(
    web: Web,
) -> None:
    run_id, token = await web.suspended()
    downstream.set_world("price", "90")
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = await session_csrf(client)
        changed = await client.post(f"/approve/{token}", data={"decision": "approve", "csrf": csrf})
        assert changed.status_code == 409 and "The details changed" in changed.text
        row = re.search(
            r'<th scope="row"><code>price</code></th>\s*'
            r'<td class="before">100</td>\s*<td class="after">90</td>',
            changed.text,
        )
        assert row, changed.text
        actions = FORM_ACTION.findall(changed.text)
        assert len(actions) == 1 and actions[0] != token
        assert downstream.effects() == []
        approved = await client.post(
            f"/approve/{actions[0]}", data={"decision": "approve", "csrf": csrf}
        )
    assert approved.status_code == 200 and "Approved" in approved.text
    assert [e[1] for e in downstream.effects()] == ["send"]
    assert [d["decision"] for d in await web.decisions(run_id)] == ["approve", "approve"]


async def test_a_guard_failure_shows_its_reason(web: Web) -> None:
    _, token = await web.suspended()
    downstream.set_world("hold", "1")
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        refused = await client.post(
            f"/approve/{token}", data={"decision": "approve", "csrf": await session_csrf(client)}
        )
    assert refused.status_code == 409
    assert '<strong class="reason">the account is on hold</strong>' in refused.text
    assert downstream.effects() == []


async def test_lost_permission_shows_no_longer_permitted(web: Web) -> None:
    run_id, token = await web.suspended()
    downstream.set_world("perm:dana", "0")
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        refused = await client.post(
            f"/approve/{token}", data={"decision": "approve", "csrf": await session_csrf(client)}
        )
    assert refused.status_code == 403 and "No longer permitted" in refused.text
    assert (await web.run(run_id)).state is RunState.HALTED and downstream.effects() == []


async def test_stored_markup_is_escaped_on_every_page(db_url: str) -> None:
    payload = "<script>alert(1)</script>"
    model = ScriptedModel(
        [{"tool_calls": [{"name": "send", "arguments": {"item": payload}}]}, {"content": "ok"}]
    )
    web = await _web(db_url, model=model)
    try:
        run_id, token = await web.suspended(question=f"please {payload}")
        escaped = html.escape(payload, quote=False)
        async with web.client() as client:
            await sign_in(client, web.keys["dana"])
            pages = [
                await client.get(f"/runs/{run_id}"),
                await client.get(f"/approve/{token}"),
                await client.get("/"),
            ]
        for page in pages:
            assert page.status_code == 200
            assert payload not in page.text and escaped in page.text
            policy = page.headers["content-security-policy"]
            assert "script-src 'self';" in policy and "unsafe" not in policy
            assert page.headers["cache-control"] == "no-store"
    finally:
        web.engine.close()


async def test_the_run_page_shows_state_budget_timeline_and_messages_to_its_owner_only(
    web: Web,
) -> None:
    run_id, token = await web.suspended(question="send the thing")
    await web.engine.resume_after_confirmation(token, "approve", "dana")
    async with web.client() as client:
        anonymous = await client.get(f"/runs/{run_id}")
        assert anonymous.status_code == 303
        assert anonymous.headers["location"] == f"/login?next=/runs/{run_id}"
        await sign_in(client, web.keys["dana"])
        own = await client.get(f"/runs/{run_id}")
        missing = await client.get("/runs/nope")
    async with web.client() as boss:
        await sign_in(boss, web.keys["boss"])
        foreign = await boss.get(f"/runs/{run_id}")
    assert own.status_code == 200
    assert "state-running" in own.text and "send the thing" in own.text
    assert '<th scope="row">tool calls</th><td>1</td>' in own.text
    assert "<code>approved</code>" in own.text and "role-tool" in own.text
    assert "<code>send</code>" in own.text  # the assistant's tool call, by name
    assert missing.status_code == foreign.status_code == 404
    assert "send the thing" not in foreign.text


async def test_ids_and_tokens_that_cannot_name_anything_are_not_found(web: Web) -> None:
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = await session_csrf(client)
        # (a NUL, "%00", is invalid_input wherever it is: test_unstorable_input.py)
        for bad in ("x" * 300, "%F0%9F%92%A5", "a%20b", "a%0Ab"):
            assert (await client.get(f"/runs/{bad}")).status_code == 404
            assert (await client.get(f"/approve/{bad}")).status_code == 404
            acted = await client.post(f"/approve/{bad}", data={"decision": "approve", "csrf": csrf})
            assert acted.status_code == 404 and "unknown or has expired" in acted.text


async def test_sign_in_refuses_bad_keys_forged_forms_and_foreign_redirects(web: Web) -> None:
    async with web.client() as client:
        bad = await try_sign_in(client, "tth_wrong")
        assert bad.status_code == 401 and "not valid" in bad.text
        assert (await client.get("/")).status_code == 303
        forged = await client.post(
            "/login", data={"key": web.keys["dana"], "csrf": "x", "next": "/"}
        )
        assert forged.status_code == 403 and "tether_session" not in forged.headers.get(
            "set-cookie", ""
        )
        away = await try_sign_in(client, web.keys["dana"], next_path="//evil.example/")
        assert away.status_code == 303 and away.headers["location"] == "/"
        cookie = away.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=lax" in cookie
        assert (await client.get("/")).status_code == 200


async def test_failed_sign_ins_slow_down_only_themselves_never_a_valid_key_from_their_address(
    web: Web,
) -> None:
    limit = web.engine.settings.auth_max_failures
    async with web.client() as client:  # behind one NAT: everyone has this address
        for n in range(limit):
            assert (await try_sign_in(client, f"tth_guess-{n}")).status_code == 401
        slowed = await try_sign_in(client, "tth_guess-x")  # the address's next failure
        assert slowed.status_code == 429 and "try again in" in slowed.text
        assert int(slowed.headers["retry-after"]) >= 1
        assert "tether_session" not in slowed.headers.get("set-cookie", "")
        signed_in = await try_sign_in(client, web.keys["dana"])  # the right key, from here
        assert signed_in.status_code == 303 and "tether_session" in signed_in.cookies
    other = httpx.ASGITransport(app=web.app, client=("10.9.9.9", 4321))
    async with httpx.AsyncClient(transport=other, base_url="http://testserver") as client:
        for _ in range(limit):  # one wrong key, typed again and again
            assert (await try_sign_in(client, "tth_typo")).status_code == 401
        again = await try_sign_in(client, "tth_typo")
        assert again.status_code == 429 and "this key failed too many times" in again.text
        assert (await try_sign_in(client, web.keys["eve"])).status_code == 303


async def test_a_session_cookie_rewritten_to_another_user_is_signed_out(web: Web) -> None:
    async with web.client() as client:
        await sign_in(client, web.keys["eve"])
        payload, _, mac = client.cookies["tether_session"].partition(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["u"] == "eve"
    as_dana = base64.urlsafe_b64encode(json.dumps({**claims, "u": "dana"}).encode())
    forged = as_dana.rstrip(b"=").decode() + "." + mac
    async with web.client() as client:
        client.cookies.set("tether_session", forged)
        assert (await client.get("/")).status_code == 303
    async with web.client() as client:
        client.cookies.set("tether_session", f"{payload}.{mac}")
        assert (await client.get("/")).status_code == 200  # the genuine one still works


async def test_sign_out_needs_the_csrf_token_and_ends_the_session(web: Web) -> None:
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = await session_csrf(client)
        refused = await client.post("/logout", data={})
        assert refused.status_code == 403 and (await client.get("/")).status_code == 200
        done = await client.post("/logout", data={"csrf": csrf})
        assert done.status_code == 303 and done.headers["location"] == "/login"
        assert (await client.get("/")).status_code == 303


async def test_a_cookie_kept_from_before_sign_out_no_longer_works(web: Web) -> None:
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        kept = client.cookies["tether_session"]
        await client.post("/logout", data={"csrf": await session_csrf(client)})
    async with web.client() as client:
        client.cookies.set("tether_session", kept)
        assert (await client.get("/")).status_code == 303


async def test_removing_a_user_or_rotating_its_key_ends_the_sessions_its_keys_opened(
    web: Web,
) -> None:
    cookies: dict[str, str] = {}
    for user in ("dana", "eve", "boss"):
        async with web.client() as client:
            await sign_in(client, web.keys[user])
            cookies[user] = client.cookies["tether_session"]
    await web.engine.operator.remove_user("dana")
    new_key = await web.engine.operator.rotate_key("eve")
    for user, status in (("dana", 303), ("eve", 303), ("boss", 200)):
        async with web.client() as client:
            client.cookies.set("tether_session", cookies[user])
            assert (await client.get("/")).status_code == status, user
    assert await web.engine.web.user_for_key(web.keys["dana"]) is None
    assert await web.engine.web.user_for_key(web.keys["eve"]) is None
    assert await web.engine.web.user_for_key(new_key) == "eve"
    async with web.client() as client:
        assert (await try_sign_in(client, new_key)).status_code == 303
        assert (await client.get("/")).status_code == 200


async def test_one_click_sign_in_is_offered_only_for_the_agents_published_users(
    db_url: str,
) -> None:
    plain = await _web(db_url)  # the test agent publishes no users
    try:
        async with plain.client() as client:
            form = await client.get("/login")
            assert "Sign in as" not in form.text
            refused = await client.post(
                "/login", data={"dev_user": "dana", "csrf": csrf_of(form.text), "next": "/"}
            )
            assert refused.status_code == 401
    finally:
        plain.engine.close()
    published = {"dana": "published-key-of-dana", "miguel": "published-key-of-miguel"}
    agent = dataclasses.replace(agents.agent(), name="any-agent", users=published)
    demo = await _web(db_url, agent=agent)
    try:
        await demo.engine.operator.ensure_agent_users()
        async with demo.client() as client:
            form = await client.get("/login")
            assert "Sign in as dana" in form.text and "Sign in as miguel" in form.text
            assert "Sign in as eve" not in form.text  # a user, but not a published one
            stranger = await client.post(
                "/login", data={"dev_user": "eve", "csrf": csrf_of(form.text), "next": "/"}
            )
            assert stranger.status_code == 401
            form = await client.get("/login")
            signed = await client.post(
                "/login", data={"dev_user": "miguel", "csrf": csrf_of(form.text), "next": "/"}
            )
            assert signed.status_code == 303
            inbox = await client.get("/")
            assert "Signed in as <strong>miguel</strong>" in inbox.text
    finally:
        demo.engine.close()


async def test_a_published_user_whose_key_is_not_stored_cannot_sign_in(db_url: str) -> None:
    agent = dataclasses.replace(agents.agent(), users={"dana": "a-key-never-stored"})
    web = await _web(db_url, agent=agent)  # dana exists, with another key
    try:
        async with web.client() as client:
            form = await client.get("/login")
            assert "Sign in as dana" in form.text
            refused = await client.post(
                "/login", data={"dev_user": "dana", "csrf": csrf_of(form.text), "next": "/"}
            )
            assert refused.status_code == 401
            assert (await client.get("/")).status_code == 303  # still signed out
    finally:
        web.engine.close()


INBOX_FORM = re.compile(
    r'action="/runs/([^"]+)/decision".*?name="tool_call_id" value="([^"]+)".*?'
    r'name="digest" value="([^"]*)"',
    re.S,
)


async def test_deciding_in_the_inbox_acts_once_and_needs_the_csrf_token(web: Web) -> None:
    run_id, _ = await web.suspended()
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        inbox = await client.get("/")
        found = INBOX_FORM.search(inbox.text)
        assert found and found.group(1) == run_id
        fields = {"tool_call_id": found.group(2), "digest": found.group(3)}
        forged = await client.post(
            f"/runs/{run_id}/decision", data={**fields, "decision": "approve", "csrf": "x"}
        )
        assert forged.status_code == 403 and downstream.effects() == []
        form = {**fields, "decision": "approve", "csrf": csrf_of(inbox.text)}
        first = await client.post(f"/runs/{run_id}/decision", data=form)
        second = await client.post(f"/runs/{run_id}/decision", data=form)
    assert first.status_code == 200
    assert second.status_code == 409 and "already" in second.text.lower()
    assert [e[1] for e in downstream.effects()] == ["send"]
    assert [d["decision"] for d in await web.decisions(run_id)] == ["approve"]


async def test_an_inbox_decision_by_a_stranger_changes_nothing(web: Web) -> None:
    run_id, _ = await web.suspended()
    run = await web.run(run_id)
    assert run.pending is not None
    async with web.client() as client:
        await sign_in(client, web.keys["eve"])
        inbox = await client.get("/")
        assert run_id not in inbox.text
        refused = await client.post(
            f"/runs/{run_id}/decision",
            data={
                "tool_call_id": run.pending.tool_call_id,
                "digest": run.pending.digest or "",
                "decision": "approve",
                "csrf": csrf_of(inbox.text),
            },
        )
    assert refused.status_code == 404
    assert (await web.run(run_id)).state is RunState.SUSPENDED
    assert downstream.effects() == []


# -- decisions with a reason, and edits (reference §9) -------------------------------------------


SHIP_ORDER = {"sku": "A-1", "quantity": 3, "rush": False, "speed": "ground"}


@pytest.fixture
async def shipping(db_url: str) -> AsyncIterator[Web]:
    """The inbox of an agent whose one tool has string, integer, number, boolean, enum and
    list arguments."""
    agent = Agent(
        name="shipping", system_prompt="Ship.", tools=(agents.ship,), resolve_scope=agents.resolve
    )
    model = ScriptedModel(
        [{"tool_calls": [{"name": "ship", "arguments": SHIP_ORDER}]}, {"content": "shipped"}]
    )
    w = await _web(db_url, model=model, agent=agent)
    yield w
    w.engine.close()


def _tag(page: str, name: str) -> str:
    """The control named ``name`` (its opening tag; a select or textarea up to its end)."""
    found = re.search(rf'<(input|select|textarea)[^>]*name="{re.escape(name)}"[^>]*>', page)
    assert found, f"no control {name}"
    if found.group(1) == "input":
        return found.group(0)
    end = page.index(f"</{found.group(1)}>", found.end())
    return page[found.start() : end]


def _hidden(page: str, name: str) -> str:
    found = re.search(rf'type="hidden" name="{re.escape(name)}" value="([^"]*)"', page)
    assert found, f"no hidden field {name}"
    return html.unescape(found.group(1))


async def _tool_result(web: Web, run_id: str) -> dict[str, Any]:
    view = await web.engine.get_run(run_id)
    [result] = [m for m in view.messages if m.get("role") == "tool"]
    content = result["content"]
    parsed: dict[str, Any] = json.loads(content) if isinstance(content, str) else content
    return parsed


async def test_the_edit_form_comes_from_the_tools_schema_prefilled_on_every_page(
    shipping: Web,
) -> None:
    run_id, token = await shipping.suspended()
    before = await shipping.run(run_id)
    async with shipping.client() as client:
        await sign_in(client, shipping.keys["dana"])
        pages = [await client.get(f"/approve/{token}"), await client.get("/")]
        pages.append(await client.get(f"/runs/{run_id}"))
        refused_get = await client.get(f"/approve/{token}/preview")
    for shown in pages:
        assert shown.status_code == 200
        assert 'type="text"' in _tag(shown.text, "arg.sku")
        assert 'value="A-1"' in _tag(shown.text, "arg.sku")
        quantity = _tag(shown.text, "arg.quantity")
        assert 'type="number"' in quantity and 'step="1"' in quantity and 'value="3"' in quantity
        assert 'step="any"' in _tag(shown.text, "arg.weight")
        assert 'value="1.5"' in _tag(shown.text, "arg.weight")
        rush = _tag(shown.text, "arg.rush")
        assert 'type="checkbox"' in rush and "checked" not in rush
        speed = _tag(shown.text, "arg.speed")
        assert '<option value="ground" selected>' in speed and '<option value="air">' in speed
        assert _tag(shown.text, "arg.labels").startswith("<textarea")
        assert 'name="reason" maxlength="2000"' in shown.text
    assert refused_get.status_code == 405  # previews are POSTs; a GET does nothing
    after = await shipping.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at


async def test_a_previewed_edit_changes_nothing_and_approving_it_runs_the_edited_call(
    shipping: Web,
) -> None:
    run_id, token = await shipping.suspended()
    before = await shipping.run(run_id)
    edits = {"arg.sku": "A-1", "arg.quantity": "5", "arg.rush": "true", "arg.speed": "air"}
    edits |= {"arg.weight": "2", "arg.labels": '["fragile"]'}
    async with shipping.client() as client:
        await sign_in(client, shipping.keys["boss"])
        csrf = await session_csrf(client)
        previews = [
            await client.post(f"/approve/{token}/preview", data={**edits, "csrf": csrf})
            for _ in range(2)
        ]
        assert (await shipping.run(run_id)).updated_at == before.updated_at
        assert await shipping.decisions(run_id) == []
        shown = previews[0]
        assert shown.status_code == 200 and "Approve the edited action?" in shown.text
        assert '<th scope="row">cost</th><td>10.0</td>' in shown.text  # re-rendered: 5 x 2
        edited = json.loads(_hidden(shown.text, "arguments"))
        assert edited == {
            "sku": "A-1",
            "quantity": 5,
            "rush": True,
            "speed": "air",
            "weight": 2.0,
            "labels": ["fragile"],
        }
        expected = await shipping.engine.preview_approval(token, "boss", edited)
        assert _hidden(shown.text, "digest") == expected.digest
        assert 'value="5"' in _tag(shown.text, "arg.quantity")  # edit again from here
        approved = await client.post(
            f"/approve/{token}",
            data={
                "decision": "approve",
                "arguments": _hidden(shown.text, "arguments"),
                "digest": _hidden(shown.text, "digest"),
                "reason": "ship five, by air",
                "csrf": csrf,
            },
        )
    assert approved.status_code == 200 and "Approved" in approved.text
    assert "With the edited arguments" in approved.text and "ship five, by air" in approved.text
    result = await _tool_result(shipping, run_id)
    assert result["edited_by_user"] == {"arguments": edited}
    assert result["result"]["quantity"] == 5 and result["result"]["speed"] == "air"
    [event] = await shipping.decisions(run_id)
    assert event["by"] == "boss" and event["reason"] == "ship five, by air"


async def test_an_invalid_edit_shows_what_is_wrong_and_the_request_stays_decidable(
    shipping: Web,
) -> None:
    run_id, token = await shipping.suspended()
    before = await shipping.run(run_id)
    async with shipping.client() as client:
        await sign_in(client, shipping.keys["dana"])
        csrf = await session_csrf(client)
        base = {"arg.sku": "A-1", "arg.quantity": "3", "csrf": csrf}
        fraction = await client.post(
            f"/approve/{token}/preview", data={**base, "arg.quantity": "2.5"}
        )
        not_json = await client.post(
            f"/approve/{token}/preview", data={**base, "arg.labels": "[fragile"}
        )
        wrong_choice = await client.post(
            f"/approve/{token}/preview", data={**base, "arg.speed": "teleport"}
        )
        tampered = await client.post(
            f"/approve/{token}",
            data={"decision": "approve", "arguments": "[1]", "csrf": csrf},
        )
        for refused in (fraction, not_json, wrong_choice):
            assert refused.status_code == 422 and "Your edits were not accepted" in refused.text
            assert f'action="/approve/{token}"' in refused.text  # still decidable here
        assert "quantity" in fraction.text and 'value="2.5"' in _tag(fraction.text, "arg.quantity")
        assert "not valid JSON" in not_json.text and "[fragile" in not_json.text
        assert "speed" in wrong_choice.text
        assert tampered.status_code == 422 and "JSON object" in tampered.text
        after = await shipping.run(run_id)
        assert after.state is RunState.SUSPENDED and after.updated_at == before.updated_at
        assert await shipping.decisions(run_id) == []
        approved = await client.post(
            f"/approve/{token}", data={"decision": "approve", "csrf": csrf}
        )
    assert approved.status_code == 200 and "Approved" in approved.text
    assert "edited_by_user" not in await _tool_result(shipping, run_id)


async def test_the_preview_routes_need_a_session_its_csrf_token_and_the_right_user(
    web: Web,
) -> None:
    run_id, token = await web.suspended()
    run = await web.run(run_id)
    assert run.pending is not None
    call = {"tool_call_id": run.pending.tool_call_id, "digest": run.pending.digest or ""}
    edit = {"arg.item": "c"}
    async with web.client() as anonymous:
        by_link = await anonymous.post(f"/approve/{token}/preview", data=edit)
        by_run = await anonymous.post(f"/runs/{run_id}/preview", data={**call, **edit})
    assert by_link.status_code == 403 and by_run.status_code == 303
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        csrf = await session_csrf(client)
        refused = [
            await client.post(f"/approve/{token}/preview", data=edit),
            await client.post(f"/runs/{run_id}/preview", data={**call, **edit, "csrf": "x"}),
            await client.post(
                f"/approve/{token}/preview",
                data={**edit, "csrf": csrf},
                headers={"Sec-Fetch-Site": "cross-site"},
            ),
        ]
        other_call = await client.post(
            f"/runs/{run_id}/preview", data={**edit, "tool_call_id": "nope", "csrf": csrf}
        )
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert other_call.status_code == 404
    async with web.client() as stranger:
        await sign_in(stranger, web.keys["eve"])
        csrf = await session_csrf(stranger)
        hidden = [
            await stranger.post(f"/approve/{token}/preview", data={**edit, "csrf": csrf}),
            await stranger.post(f"/runs/{run_id}/preview", data={**call, **edit, "csrf": csrf}),
        ]
    for response in hidden:
        assert response.status_code == 404 and "unknown or has expired" in response.text
        assert "dana" not in response.text
    after = await web.run(run_id)
    assert after.state is RunState.SUSPENDED and after.updated_at == run.updated_at
    assert await web.decisions(run_id) == [] and downstream.effects() == []


async def test_an_inbox_edit_executes_only_the_arguments_whose_preview_was_shown(
    web: Web,
) -> None:
    run_id, _ = await web.suspended()
    async with web.client() as client:
        await sign_in(client, web.keys["dana"])
        inbox = await client.get("/")
        found = INBOX_FORM.search(inbox.text)
        assert found and found.group(1) == run_id
        call = {"tool_call_id": found.group(2), "digest": found.group(3)}
        csrf = csrf_of(inbox.text)
        shown = await client.post(
            f"/runs/{run_id}/preview", data={**call, "arg.item": "c", "csrf": csrf}
        )
        assert shown.status_code == 200 and f'action="/runs/{run_id}/decision"' in shown.text
        assert _hidden(shown.text, "digest") == found.group(3)  # the suspension it names
        decision = {
            **call,
            "decision": "approve",
            "approved_digest": _hidden(shown.text, "approved_digest"),
            "csrf": csrf,
        }
        # Arguments other than the previewed ones, under the previewed digest: not executed.
        swapped = await client.post(
            f"/runs/{run_id}/decision", data={**decision, "arguments": '{"item": "d"}'}
        )
        assert swapped.status_code == 409 and "The details changed" in swapped.text
        assert downstream.effects() == []
        again = INBOX_FORM.search((await client.get("/")).text)
        assert again and again.group(2) == found.group(2)  # the same call, suspended again
        shown = await client.post(
            f"/runs/{run_id}/preview",
            data={"tool_call_id": again.group(2), "digest": again.group(3), "arg.item": "c"}
            | {"csrf": csrf},
        )
        approved = await client.post(
            f"/runs/{run_id}/decision",
            data={
                "tool_call_id": again.group(2),
                "digest": again.group(3),
                "decision": "approve",
                "arguments": _hidden(shown.text, "arguments"),
                "approved_digest": _hidden(shown.text, "approved_digest"),
                "csrf": csrf,
            },
        )
    assert approved.status_code == 200 and "Approved" in approved.text
    assert [e[1:] for e in downstream.effects()] == [("send", "c")]
    assert (await _tool_result(web, run_id))["edited_by_user"] == {"arguments": {"item": "c"}}


async def test_a_decline_reason_reaches_the_model_and_every_later_answer(web: Web) -> None:
    run_id, token = await web.suspended()
    run = await web.run(run_id)
    assert run.pending is not None
    form = {"tool_call_id": run.pending.tool_call_id, "digest": run.pending.digest or ""}
    async with web.client() as client:
        await sign_in(client, web.keys["boss"])
        csrf = await session_csrf(client)
        too_long = await client.post(
            f"/runs/{run_id}/decision",
            data={**form, "decision": "decline", "reason": "x" * 2001, "csrf": csrf},
        )
        assert too_long.status_code == 422 and await web.decisions(run_id) == []
        reason = "wrong <b>customer</b>\r\nsend it to Henderson"
        declined = await client.post(
            f"/runs/{run_id}/decision",
            data={**form, "decision": "decline", "reason": reason, "csrf": csrf},
        )
        again = await client.post(
            f"/runs/{run_id}/decision", data={**form, "decision": "approve", "csrf": csrf}
        )
        reopened = await client.get(f"/approve/{token}")
    stored = "wrong <b>customer</b>\nsend it to Henderson"
    escaped = html.escape(stored, quote=False)
    assert declined.status_code == 200 and "Declined" in declined.text
    for shown in (declined, again, reopened):
        assert f'<p class="decision-reason">{escaped}</p>' in shown.text
    assert again.status_code == 409 and "Already decided" in again.text
    result = await _tool_result(web, run_id)
    assert result["error"] == "declined_by_user" and result["reason"] == stored
    assert [(d["by"], d["reason"]) for d in await web.decisions(run_id)] == [("boss", stored)]
    assert downstream.effects() == []
