"""Hidden characters on the inbox's pages, in-process on both backends (reference §6): a run
whose question and arguments hold bidirectional controls and invisible characters is
shown on every page with each of them escaped and marked, never as itself (not in the
text, not in a form field's value); the edit form shows them escaped and, left as shown,
carries the value as asked; and what is approved and executed is the stored value."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import downstream
import httpx
import pytest
from inbox_web import Web, csrf_of, session_csrf, sign_in, web

from tether import ScriptedModel
from tether.visible import escape, has_hidden

# A right-to-left override, a zero-width space, a tag character (beyond the Basic
# Multilingual Plane) and a left-to-right isolate.
HIDDEN = "acct-1234\u202e9876\u200b-\U000e0041x\u2066"
QUESTION = f"send {HIDDEN} now"
ARGUMENTS_FIELD = re.compile(r'name="arguments" value="([^"]*)"')


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Web]:
    model = ScriptedModel(
        [{"tool_calls": [{"name": "send", "arguments": {"item": HIDDEN}}]}, {"content": "sent"}]
    )
    w = await web(db_url, model=model)
    yield w
    w.close()


def shown_escaped(page: httpx.Response) -> None:
    """The page holds no hidden character, and shows the escaped ones marked, with the
    warning."""
    assert page.status_code == 200, page.text
    assert not has_hidden(page.text)
    assert '<span class="hidden-char" title="hidden character U+202E' in page.text
    assert "hidden-warning" in page.text


async def test_every_page_shows_hidden_characters_escaped_and_marked_never_as_themselves(
    app: Web,
) -> None:
    run_id, token = await app.suspended(QUESTION)
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        for path in ("/", "/runs", f"/runs/{run_id}", f"/approve/{token}"):
            shown_escaped(await client.get(path))
    async with app.client() as boss:
        await sign_in(boss, app.keys["boss"])
        shown_escaped(await boss.get("/"))
        shown_escaped(await boss.get(f"/runs/{run_id}"))  # the approver's view
        # The edit form, posted as it was shown: the value as asked, still marked.
        csrf = await session_csrf(boss)
        edited = await boss.post(
            f"/approve/{token}/preview", data={"csrf": csrf, "arg.item": escape(HIDDEN)}
        )
        shown_escaped(edited)
        assert "You changed nothing" in edited.text
        found = ARGUMENTS_FIELD.search(edited.text)
        assert found is not None
        digest = re.search(r'name="digest" value="([0-9a-f]{64})"', edited.text)
        assert digest is not None
        decided = await boss.post(
            f"/approve/{token}",
            data={
                "csrf": csrf,
                "decision": "approve",
                "arguments": html.unescape(found.group(1)),
                "digest": digest.group(1),
            },
        )
        assert decided.status_code == 200 and "Approved" in decided.text, decided.text
        assert not has_hidden(decided.text)
    assert [(tool, item) for _, tool, item in downstream.effects()] == [("send", HIDDEN)]
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        shown_escaped(await client.get(f"/runs/{run_id}"))  # timeline and messages too


async def test_an_edit_typed_over_a_hidden_character_is_taken_as_typed(app: Web) -> None:
    run_id, _ = await app.suspended(QUESTION)
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        inbox = await client.get("/")
        call = re.search(r'name="tool_call_id" value="([^"]+)"', inbox.text)
        shown = re.search(r'name="digest" value="([0-9a-f]{64})"', inbox.text)
        assert call is not None and shown is not None
        typed = escape(HIDDEN).replace("1234", "1235")  # the escapes are now typed text
        edited = await client.post(
            f"/runs/{run_id}/preview",
            data={
                "csrf": csrf_of(inbox.text),
                "tool_call_id": call.group(1),
                "digest": shown.group(1),
                "arg.item": typed,
            },
        )
    assert edited.status_code == 200 and not has_hidden(edited.text)
    found = ARGUMENTS_FIELD.search(edited.text)
    assert found is not None and "\\\\u202e" in found.group(1)  # a backslash, as typed
    assert 'table class="diff edits"' in edited.text
