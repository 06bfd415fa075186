"""A tree of sub-agents in the inbox's pages (reference §18), in-process on both backends:
every run's page shows the tree (each run under the run that started it, with its agent,
state and a link, the shown run marked) and a run alone in its tree shows none; the
root's page shows every call of the tree that waits for a decision with the forms of that
call's own run's page, which decide it on that run (an edit too), and the page of the
answer leads back to the root; the inbox names a child's tree and links its root for its
owner, never for an approver; stored hidden characters stay escaped; the root's page
carries the hooks that follow the tree's other runs live."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import downstream
import httpx
import inbox_trees
import pytest
from inbox_trees import forms
from inbox_web import Web, csrf_of, sign_in, web

from tether import StopKind
from tether.runs import RunState

# One run of a page's tree: its depth, whether it is the page's own, its id, its line.
TREE_ROW = re.compile(
    r'<li class="tree-run depth-(\d+)( current)?" id="tree-run-([0-9a-f]+)"[^>]*>\s*'
    r'<div class="tree-line">(.*?)</div>',
    re.S,
)
STATE = re.compile(r'<span class="state state-(\w+)">')
# The root page's section of the tree's requests.
PENDING = 'class="card pending tree-pending"'


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Web]:
    w = await web(db_url, model=inbox_trees.script(), agent=inbox_trees.planner())
    yield w
    w.close()


@asynccontextmanager
async def owner(app: Web) -> AsyncIterator[httpx.AsyncClient]:
    """A client signed in as dana, whose tree it is."""
    async with app.client() as client:
        await sign_in(client, app.keys["dana"])
        yield client


def tree_rows(page: str) -> list[tuple[int, bool, str, str]]:
    """The page's tree in page order: depth, whether it is the page's run, id, state."""
    rows = []
    for depth, current, run_id, line in TREE_ROW.findall(page):
        state = STATE.search(line)
        assert state, line
        rows.append((int(depth), bool(current), run_id, state.group(1)))
    return rows


def part(page: str, name: str) -> str:
    """The text of one ``data-live`` part of a page (up to the next part)."""
    start = page.index(f'<div data-live="{name}">')
    return page[start : page.index("<div data-live=", start + 1)]


async def test_every_run_s_page_shows_its_tree_each_run_under_the_run_that_started_it(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    async with owner(app) as client:
        pages = {
            run_id: (await client.get(f"/runs/{run_id}")).text
            for run_id in (tree.root, tree.clerk, tree.researcher, tree.courier)
        }
    order = [tree.root, tree.clerk, tree.researcher, tree.courier]
    for run_id, page in pages.items():
        rows = tree_rows(page)
        assert [(depth, rid) for depth, _, rid, _ in rows] == [
            (0, tree.root),
            (1, tree.clerk),
            (1, tree.researcher),
            (2, tree.courier),
        ]
        assert [state for *_, state in rows] == ["waiting", "suspended", "waiting", "suspended"]
        assert [rid for _, current, rid, _ in rows if current] == [run_id]  # its own, marked
        shown = part(page, "tree")
        for other in order:  # every other run of the tree is linked, the page's own is not
            assert (f'href="/runs/{other}"' in shown) is (other != run_id)
    root = part(pages[tree.root], "tree")
    assert "planner" in root and "clerk" in root and "courier" in root
    assert "Task: look into c" in root and "waits for the runs of its sub-agents" in root
    assert "1 call waits for a decision" in root
    # The courier's page: the root named and linked, and its own request, with its form.
    courier = pages[tree.courier]
    assert f'<a href="/runs/{tree.root}" class="tree-root">' in courier
    assert forms(part(courier, "pending"), f"/runs/{tree.courier}/decision")
    assert PENDING not in courier  # the tree's requests are on the root's page


async def test_a_run_alone_in_its_tree_shows_none(db_url: str) -> None:
    plain = await web(db_url)
    try:
        run_id, _ = await plain.suspended()
        async with owner(plain) as client:
            page = (await client.get(f"/runs/{run_id}")).text
    finally:
        plain.close()
    for name in ("tree", "tree-pending"):  # the parts the script swaps, empty
        assert "".join(part(page, name).split()) == f'<divdata-live="{name}"></div>'
    assert "data-live-list" not in page and "Tree of sub-agents" not in page
    assert forms(page, f"/runs/{run_id}/decision")  # its own request, as ever


async def test_the_root_s_page_shows_every_request_of_the_tree_with_its_run_s_own_forms(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    async with owner(app) as client:
        root = (await client.get(f"/runs/{tree.root}")).text
        clerk = (await client.get(f"/runs/{tree.clerk}")).text
        courier = (await client.get(f"/runs/{tree.courier}")).text
        researcher = (await client.get(f"/runs/{tree.researcher}")).text
    asking = part(root, "tree-pending")
    assert part(root, "pending").count("<form") == 0  # the root itself waits on no call
    assert "2 calls of the runs this" in asking
    for child, page, agent in ((tree.clerk, clerk, "clerk"), (tree.courier, courier, "courier")):
        card = asking[asking.index(f'id="tree-request-{child}"') :]
        assert f'<span class="tree-agent">{agent}</span>' in card[:400]
        # Each form of the child's request, on the root's page, is the child's page's own:
        # same action, same call and digest, the same session's CSRF token.
        for action in (f"/runs/{child}/decision", f"/runs/{child}/preview"):
            on_root, on_child = forms(asking, action), forms(part(page, "pending"), action)
            assert len(on_root) == 1 and on_root == on_child
        [form] = forms(asking, f"/runs/{child}/decision")
        assert form.values["csrf"] == csrf_of(root)
        assert (
            form.values["tool_call_id"]
            == (await app.run(child)).pending_calls[0].pending.tool_call_id
        )
    assert "started by researcher" in asking  # the courier is the researcher's
    assert asking.index(tree.clerk) < asking.index(tree.courier)  # in tree order
    # Only the root's page gathers them: a parent below it does not.
    assert PENDING not in researcher and not forms(researcher, f"/runs/{tree.courier}/decision")


async def test_a_child_s_call_decided_from_the_root_s_page_is_decided_on_the_child(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    async with owner(app) as client:
        root = (await client.get(f"/runs/{tree.root}")).text
        [form] = forms(part(root, "tree-pending"), f"/runs/{tree.courier}/decision")
        forged = await client.post(form.action, data={**form.values, "csrf": "x" * 64})
        assert forged.status_code == 403 and await app.decisions(tree.courier) == []

        approved = await client.post(form.action, data={**form.values, "decision": "approve"})
        assert approved.status_code == 200 and "<h1>Approved</h1>" in approved.text
        assert f'href="/runs/{tree.root}" class="back-to-root"' in approved.text
        assert f'href="/runs/{tree.courier}" class="back-to-run"' in approved.text
        assert [(tool, item) for _, tool, item in downstream.effects()] == [("send", "c")]
        assert [d["by"] for d in await app.decisions(tree.courier)] == ["dana"]
        assert await app.decisions(tree.clerk) == []  # the other child's call still waits

        after = (await client.get(f"/runs/{tree.root}")).text
        asking = part(after, "tree-pending")
        assert forms(asking, f"/runs/{tree.courier}/decision") == []
        assert len(forms(asking, f"/runs/{tree.clerk}/decision")) == 1
        assert "1 call of the runs this" in asking
        states = {rid: state for _, _, rid, state in tree_rows(after)}
        assert states[tree.courier] != "suspended"
        assert "last decision: approved by dana" in part(after, "tree")

        # The courier answers, which wakes the researcher, which answers too.
        assert (await app.engine.run_until_stop(tree.courier)).kind is StopKind.ANSWERED
        assert (await app.engine.run_until_stop(tree.researcher)).kind is StopKind.ANSWERED
        page = (await client.get(f"/runs/{tree.root}")).text
        states = {rid: state for _, _, rid, state in tree_rows(page)}
        assert states[tree.courier] == states[tree.researcher] == "answered"

        # The clerk's call declined from the root's page, with a reason: the last child
        # stops, and the root answers.
        [form] = forms(part(page, "tree-pending"), f"/runs/{tree.clerk}/decision")
        declined = await client.post(
            form.action, data={**form.values, "decision": "decline", "reason": "not today"}
        )
        assert declined.status_code == 200 and "<h1>Declined</h1>" in declined.text
        assert (await app.engine.run_until_stop(tree.clerk)).kind is StopKind.ANSWERED
        assert (await app.engine.run_until_stop(tree.root)).kind is StopKind.ANSWERED
        done = (await client.get(f"/runs/{tree.root}")).text
    assert [state for *_, state in tree_rows(done)] == ["answered"] * 4
    assert PENDING not in done and "data-live-list" not in done
    assert [(d["decision"], d.get("reason")) for d in await app.decisions(tree.clerk)] == [
        ("decline", "not today")
    ]
    assert len(downstream.effects()) == 1  # the declined send was never made


async def test_an_edit_of_a_child_s_call_from_the_root_s_page_is_previewed_and_approved(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    async with owner(app) as client:
        root = (await client.get(f"/runs/{tree.root}")).text
        [edit] = forms(part(root, "tree-pending"), f"/runs/{tree.clerk}/preview")
        assert edit.values["arg.item"] == "b"  # the sub-agent's tool's own field
        preview = await client.post(edit.action, data={**edit.values, "arg.item": "z"})
        assert preview.status_code == 200 and "Approve the edited action?" in preview.text
        [approve] = forms(preview.text, f"/runs/{tree.clerk}/decision")
        approved = await client.post(approve.action, data={**approve.values, "decision": "approve"})
    assert approved.status_code == 200 and "<h1>Approved</h1>" in approved.text
    assert [(tool, item) for _, tool, item in downstream.effects()] == [("send", "z")]
    assert [d["decision"] for d in await app.decisions(tree.clerk)] == ["approve"]


async def test_hidden_characters_of_a_child_s_request_stay_escaped_on_the_root_s_page(
    db_url: str,
) -> None:
    app = await web(db_url, model=inbox_trees.script("b\u202ec"), agent=inbox_trees.planner())
    try:
        tree = await inbox_trees.grow(app.engine)
        async with owner(app) as client:
            root = (await client.get(f"/runs/{tree.root}")).text
    finally:
        app.close()
    assert "\u202e" not in root
    card = part(root, "tree-pending")
    card = card[card.index(f'id="tree-request-{tree.clerk}"') : card.index(tree.courier)]
    marked = '<span class="hidden-char" title="hidden character U+202E'
    assert f"send b{marked}" in card and 'value="b\\u202ec"' in card  # the edit form's too
    assert "This request holds hidden characters" in card
    assert f"Task: send b{marked}" in part(root, "tree")  # the task in the tree, escaped too


async def test_the_inbox_names_a_child_s_tree_and_links_its_root_for_its_owner_only(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    async with owner(app) as client:
        mine = (await client.get("/")).text
    async with app.client() as client:
        await sign_in(client, app.keys["boss"])
        theirs = (await client.get("/")).text
        root = await client.get(f"/runs/{tree.root}")
        clerk = await client.get(f"/runs/{tree.clerk}")
    for child, agent in ((tree.clerk, "clerk"), (tree.courier, "courier")):
        for page in (mine, theirs):
            card = page[page.index(f'id="run-{child}"') :]
            assert f'sub-agent <strong class="tree-agent">{agent}</strong>' in card[:800]
            assert len(forms(page, f"/runs/{child}/decision")) == 1
    assert mine.count(f'href="/runs/{tree.root}" class="tree-root"') == 2
    assert f'href="/runs/{tree.root}"' not in theirs  # not the approver's to open
    # The approver opens a child's request, read-only, and nothing of the tree.
    assert root.status_code == 404
    assert clerk.status_code == 200 and "approver-view" in clerk.text
    assert "Tree of sub-agents" not in clerk.text and tree.root not in clerk.text


async def test_the_root_s_page_follows_the_tree_s_other_runs_and_its_timeline_names_them(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    async with owner(app) as client:
        root = (await client.get(f"/runs/{tree.root}")).text
        await app.engine.cancel_run(tree.researcher, "dana")  # and its courier with it
        after = (await client.get(f"/runs/{tree.root}")).text
    assert f'data-live-stream="/runs/{tree.root}/live?after=' in root
    assert 'data-live-list="/live"' in root
    followed = re.findall(r'data-live-run="([0-9a-f]+)"', root)
    assert followed == [tree.clerk, tree.researcher, tree.courier]  # not the page's own run
    assert re.findall(r'data-live-run="([0-9a-f]+)"', after) == [tree.clerk]
    states = {rid: state for _, _, rid, state in tree_rows(after)}
    assert states[tree.researcher] == states[tree.courier] == "cancelled"
    timeline = after[after.index('class="rows timeline"') :]
    assert f"Started clerk&#39;s run {tree.clerk[:8]}" in timeline
    assert f"Its run {tree.researcher[:8]} stopped: cancelled" in timeline
    assert (await app.run(tree.root)).state is RunState.WAITING  # the clerk still holds it


async def test_a_child_halted_by_the_root_s_limits_names_them_and_the_root_shows_the_tree_s_use(
    app: Web,
) -> None:
    # Two steps for the whole tree: the root's and the clerk's; the researcher's is refused.
    started = await app.engine.ask("dana", inbox_trees.QUESTION, limits={"max_steps": 2})
    await inbox_trees.carry(app.engine, started.run_id)
    clerk, researcher = (r.id for r in app.engine.runner.store.children(started.run_id))
    assert (await app.run(researcher)).halted_by == started.run_id
    async with owner(app) as client:
        root = (await client.get(f"/runs/{started.run_id}")).text
        below = (await client.get(f"/runs/{researcher}")).text
    line = root[root.index(f'id="tree-run-{researcher}"') :]
    line = " ".join(line[: line.index("</li>")].split())
    assert '<span class="state state-halted">halted</span>' in line
    assert "it reached its step limit (max_steps)" in line
    assert f"on the limits of planner <code>{started.run_id[:8]}</code>, above it" in line
    assert "tree-holds" not in line  # its own page cannot continue it: the root's limits hold it
    # The root's budget: its own step, and the tree's two, against its limit of 2.
    steps = re.search(r'<th scope="row">steps</th>(.*?)</tr>', root)
    assert steps and steps.group(1) == '<td>1</td><td class="consumed-tree">2</td><td>2</td>'
    assert "With the runs it started" in root and "With the runs it started" not in below
    cancel = " ".join(root[root.index('class="stack cancel-form"') :].split())
    assert "The 2 runs below it in its tree that have not stopped are cancelled with it" in cancel
    assert len(forms(part(root, "tree-pending"), f"/runs/{clerk}/decision")) == 1
    # The grant is the root's: its page offers it, the researcher's names the root instead.
    assert not forms(below, f"/runs/{researcher}/continue")
    assert f'on the limits of run <a href="/runs/{started.run_id}">' in " ".join(below.split())
    [grant] = forms(root, f"/runs/{started.run_id}/continue")
    assert "1 run below it in its tree halted on its limits" in " ".join(root.split())
    assert "1 run below it halted on its limits: continuing it resumes that run" in " ".join(
        root.split()
    )
    async with owner(app) as client:
        csrf = csrf_of((await client.get(f"/runs/{researcher}")).text)
        refused = await client.post(f"/runs/{researcher}/continue", data={"csrf": csrf})
        assert refused.status_code == 409 and "an ancestor&#39;s limits halted" in refused.text
        granted = await client.post(
            grant.action, data={**grant.values, "csrf": csrf, "reason": "go on"}
        )
        assert granted.status_code == 303
    assert (await app.run(researcher)).state is not RunState.HALTED
    assert (await app.engine.run_until_stop(researcher)).kind is StopKind.WAITING  # its courier


async def test_a_child_halted_while_its_parent_waits_says_its_owner_must_continue_or_cancel_it(
    app: Web,
) -> None:
    tree = await inbox_trees.grow(app.engine)
    downstream.set_world("perm:dana", "0")  # dana may no longer send
    async with owner(app) as client:
        root = (await client.get(f"/runs/{tree.root}")).text
        [form] = forms(part(root, "tree-pending"), f"/runs/{tree.clerk}/decision")
        refused = await client.post(form.action, data={**form.values, "decision": "approve"})
        assert refused.status_code == 403 and "No longer permitted" in refused.text
        assert f'href="/runs/{tree.root}" class="back-to-root"' in refused.text
        after = (await client.get(f"/runs/{tree.root}")).text
    assert downstream.effects() == []
    line = after[after.index(f'id="tree-run-{tree.clerk}"') :]
    line = line[: line.index("</li>")]
    assert "its owner may no longer do what it asked (no_longer_permitted)" in line
    assert "The run that started it waits for it: continue it or cancel it" in line
    assert forms(part(after, "tree-pending"), f"/runs/{tree.clerk}/decision") == []
