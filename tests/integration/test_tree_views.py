"""A tree of sub-agents as it is seen (reference §18), on both backends: a run's own JSON
places it in its tree (a parent's children in call order, its ``consumed_tree``), the tree
from any run of it over HTTP, in Python and depth first, lists of top-level runs only, a
child's notices and approval requests naming its root and parent, a child's thread that
is no conversation, and a thread busy while its run waits for its children.

Every tree is ``trees.py``'s: a planner hands "find A" and "find B" to two researchers,
each of which hands "check it" to a checker. No worker runs: ``trees.settle`` carries them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import inprocess
import pytest
import trees
from json_api import DANA, KEYS, MIGUEL, fingerprint, refused
from waiting import until
from webhooks import Flaky

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.budget import Budget
from tether.errors import NotFound
from tether.notify import LogNotifier, Notice
from tether.runs import Run, RunState
from tether.webhook import WebhookNotifier

# A notice's delivery window, as tests/integration/test_notices.py gives it.
WINDOW_S = 1.0


@dataclass
class Tree:
    """A settled tree, by the role of each run."""

    engine: Engine
    client: httpx.AsyncClient
    root: Run
    researchers: list[Run]
    checkers: list[Run]

    @property
    def runs(self) -> list[Run]:
        """Depth first: the planner, then each researcher followed by its checker."""
        (a, b), (check_a, check_b) = self.researchers, self.checkers
        return [self.root, a, check_a, b, check_b]


@asynccontextmanager
async def served(url: str, **options: Any) -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    """``trees.engine`` (with ``options``) behind the JSON API, users ``dana`` and
    ``miguel`` with their keys."""
    engine = trees.engine(url, **options)
    for user in ("dana", "miguel"):
        await engine.operator.add_user(user, KEYS[user])
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            yield engine, c
    finally:
        engine.close()


async def settled(engine: Engine, client: httpx.AsyncClient) -> Tree:
    """Dana's planner asked, and its tree carried until no run of it is ready."""
    root = await engine.start_run("dana", "plan it")
    found = await trees.settle(engine, root.id)
    store = engine.runner.store
    researchers = store.children(root.id)
    checkers = [store.children(r.id)[0] for r in researchers]
    return Tree(
        engine=engine,
        client=client,
        root=found[root.id],
        researchers=[found[r.id] for r in researchers],
        checkers=[found[c.id] for c in checkers],
    )


def summed(runs: list[Run]) -> Budget:
    total = Budget()
    for run in runs:
        total = total.plus(run.budget)
    return total


def same_budget(shown: dict[str, Any], expected: Budget) -> None:
    want = expected.to_json()
    assert {k: v for k, v in shown.items() if k != "spend_usd"} == {
        k: v for k, v in want.items() if k != "spend_usd"
    }
    assert shown["spend_usd"] == pytest.approx(want["spend_usd"])


async def test_a_runs_own_json_places_it_in_its_tree_with_its_children_in_call_order(
    db_url: str,
) -> None:
    async with served(db_url) as (engine, client):
        tree = await settled(engine, client)
        root, (a, b), (check_a, check_b) = tree.root, tree.researchers, tree.checkers

        shown = (await client.get(f"/v1/runs/{root.id}", headers=DANA)).json()
        assert (shown["state"], shown["answer"]) == ("answered", "planned")
        assert (shown["parent_run_id"], shown["parent_tool_call_id"]) == (None, None)
        assert (shown["root_run_id"], shown["depth"], shown["halted_by"]) == (root.id, 0, None)
        assert shown["children"] == [
            {"id": a.id, "agent": "researcher", "tool_call_id": a.parent_tool_call_id,
             "state": "answered"},
            {"id": b.id, "agent": "researcher", "tool_call_id": b.parent_tool_call_id,
             "state": "answered"},
        ]  # fmt: skip
        calls = [c["id"] for m in shown["messages"] for c in m.get("tool_calls") or []]
        assert [a.parent_tool_call_id, b.parent_tool_call_id] == calls[:2]  # call order
        same_budget(shown["budget"]["consumed"], root.budget)
        same_budget(shown["budget"]["consumed_tree"], summed(tree.runs))

        child = (await client.get(f"/v1/runs/{a.id}", headers=DANA)).json()
        assert (child["parent_run_id"], child["parent_tool_call_id"]) == (
            root.id,
            a.parent_tool_call_id,
        )
        assert (child["root_run_id"], child["depth"]) == (root.id, 1)
        assert [c["id"] for c in child["children"]] == [check_a.id]
        assert child["children"][0]["agent"] == "checker"
        same_budget(child["budget"]["consumed_tree"], summed([a, check_a]))

        leaf = (await client.get(f"/v1/runs/{check_b.id}", headers=DANA)).json()
        assert (leaf["parent_run_id"], leaf["root_run_id"], leaf["depth"]) == (b.id, root.id, 2)
        assert leaf["children"] == [] and leaf["budget"]["consumed_tree"] is None
        assert (leaf["answer"], leaf["question"]) == ("checked", "check it")

        # The Python API holds the same.
        view = await engine.get_run(root.id, user="dana")
        assert [c.id for c in view.children] == [a.id, b.id]
        assert view.consumed_tree is not None and view.consumed_tree.steps == sum(
            r.budget.steps for r in tree.runs
        )
        assert view.to_json()["children"] == shown["children"]
        leaf_view = await engine.get_run(check_b.id)
        assert (leaf_view.children, leaf_view.consumed_tree) == ([], None)
        # Another user's child is as missing as any run.
        refused(await client.get(f"/v1/runs/{a.id}", headers=MIGUEL), 404, "not_found")


async def test_a_run_of_an_agent_without_sub_agents_reads_no_children(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    try:
        outcome = await engine.ask("dana", "work")
        read = inprocess.count_calls(engine, "children")
        view = await engine.get_run(outcome.run_id)
        assert read == [] and (view.children, view.consumed_tree) == ([], None)
        data = view.to_json()
        assert data["children"] == [] and data["budget"]["consumed_tree"] is None
        assert (data["root_run_id"], data["depth"], data["parent_run_id"]) == (
            outcome.run_id,
            0,
            None,
        )
    finally:
        engine.close()


async def test_the_tree_is_read_depth_first_from_any_run_of_it_by_its_owner_only(
    db_url: str,
) -> None:
    async with served(db_url) as (engine, client):
        tree = await settled(engine, client)
        root = tree.root
        for named in (root, tree.checkers[1], tree.researchers[0]):
            response = await client.get(f"/v1/runs/{named.id}/tree", headers=DANA)
            assert response.status_code == 200, response.text
            body = response.json()
            assert set(body) == {"root_run_id", "runs", "consumed_tree"}
            assert body["root_run_id"] == root.id
            assert [r["id"] for r in body["runs"]] == [r.id for r in tree.runs]
        assert [(r["agent"], r["depth"]) for r in body["runs"]] == [
            ("planner", 0), ("researcher", 1), ("checker", 2), ("researcher", 1), ("checker", 2),
        ]  # fmt: skip
        first = body["runs"][1]
        assert set(first) == {
            "id", "parent_run_id", "parent_tool_call_id", "agent", "agent_version", "depth",
            "state", "halt_reason", "halted_by", "budget", "pending_calls",
        }  # fmt: skip
        assert (first["parent_run_id"], first["parent_tool_call_id"]) == (
            root.id,
            tree.researchers[0].parent_tool_call_id,
        )
        assert first["agent_version"] == tree.researchers[0].agent_version != root.agent_version
        assert (first["state"], first["halt_reason"], first["pending_calls"]) == (
            "answered",
            None,
            [],
        )
        same_budget(first["budget"]["consumed_tree"], summed(tree.runs[1:3]))
        assert body["runs"][2]["budget"]["consumed_tree"] is None  # a checker has no children
        same_budget(body["consumed_tree"], summed(tree.runs))
        same_budget(body["runs"][0]["budget"]["consumed_tree"], summed(tree.runs))

        python = await engine.get_tree(tree.checkers[0].id, user="dana")
        assert python.to_json() == body
        refused(await client.get(f"/v1/runs/{root.id}/tree", headers=MIGUEL), 404, "not_found")
        with pytest.raises(NotFound):
            await engine.get_tree(tree.checkers[0].id, user="miguel")
        refused(await client.get("/v1/runs/nope/tree", headers=DANA), 404, "not_found")
        refused(await client.get(f"/v1/runs/{root.id}/tree"), 401, "unauthenticated")


async def test_lists_hold_top_level_runs_and_a_child_is_reached_through_its_tree(
    db_url: str,
) -> None:
    async with served(db_url) as (engine, client):
        tree = await settled(engine, client)
        other = await engine.start_run("dana", "plan again")  # not carried: no children

        listed = (await client.get("/v1/runs", headers=DANA)).json()
        assert [r["id"] for r in listed["items"]] == [other.id, tree.root.id]
        assert "children" not in listed["items"][0]  # a list's items leave the tree out
        assert all(r["depth"] == 0 and r["parent_run_id"] is None for r in listed["items"])
        page = (await client.get("/v1/runs?limit=1", headers=DANA)).json()
        assert ([r["id"] for r in page["items"]], page["more"]) == ([other.id], 1)
        rest = (await client.get(page["next"], headers=DANA)).json()
        assert ([r["id"] for r in rest["items"]], rest["more"]) == ([tree.root.id], 0)
        everyone = await engine.list_runs(None, limit=1000)
        assert [r.id for r in everyone] == [other.id, tree.root.id]
        assert [r.id for r in await engine.list_runs("dana", state="answered")] == [tree.root.id]


class Both:
    """Each notice to the log and to a webhook."""

    def __init__(self, url: str) -> None:
        self.log = LogNotifier()
        self.hook = WebhookNotifier(url, attempts=1)

    async def send(self, notice: Notice) -> bool:
        await self.log.send(notice)
        return await self.hook.send(notice)


async def test_a_childs_notices_and_requests_name_its_root_and_its_parent(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The first notices and the reaper's re-issues alike, in the webhook's JSON and the
    log's line; and each request of ``GET /v1/approvals``."""
    caplog.set_level(logging.INFO, logger="tether.notify")
    hook = Flaky(failures=2)  # the two first notices are refused, then re-issued
    script = trees.model(research=trees.SENDS)
    options = {"heartbeat_timeout_s": 0.05, "notice_timeout_s": WINDOW_S}
    try:
        async with served(db_url, script=script, notifier=Both(hook.url), **options) as (
            engine,
            client,
        ):
            root = await engine.start_run("dana", "plan it")
            found = await trees.settle(engine, root.id)
            children = [r for r in found.values() if r.depth == 1]
            assert [r.state for r in children] == [RunState.SUSPENDED] * 2
            assert found[root.id].state is RunState.WAITING
            await engine.runner.services.outbox.drain(10)
            assert hook.received == []
            since = max(r.suspended_at or 0 for r in children)
            await until(lambda: engine.runner.store.now() - since > WINDOW_S)
            hook.failures = 0
            reissued = (await engine.operator.reap()).notices_reissued
            assert sorted(reissued) == sorted(r.id for r in children)
            await engine.runner.services.outbox.drain(10)

            posted = {n["run_id"]: n for n in hook.received}
            assert set(posted) == {r.id for r in children}
            logged = [r for r in caplog.records if getattr(r, "action", "") == "suspension_notice"]
            assert len(logged) == 4  # two refused, two re-issued
            for child in children:
                assert (posted[child.id]["root_run_id"], posted[child.id]["parent_run_id"]) == (
                    root.id,
                    root.id,
                )
                for line in (r for r in logged if r.__dict__["run_id"] == child.id):
                    assert (line.__dict__["root_run_id"], line.__dict__["parent_run_id"]) == (
                        root.id,
                        root.id,
                    )

            listed = (await client.get("/v1/approvals", headers=DANA)).json()["items"]
            assert sorted(i["run_id"] for i in listed) == sorted(r.id for r in children)
            assert {(i["root_run_id"], i["parent_run_id"]) for i in listed} == {(root.id, root.id)}
            # The tree shows the calls its suspended runs wait on.
            shown = (await client.get(f"/v1/runs/{root.id}/tree", headers=DANA)).json()
            waits = {r["id"]: r["pending_calls"] for r in shown["runs"]}
            for child in children:
                (call,) = waits[child.id]
                assert (call["tool"], call["decided"]) == ("send", None)
            assert waits[root.id] == []
    finally:
        hook.close()


async def test_a_top_level_runs_notice_names_itself_as_its_root(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    try:
        outcome = await engine.ask("dana", "send")
        assert outcome.kind is StopKind.SUSPENDED
        data = notifier.last(outcome.run_id).to_json()
        assert (data["root_run_id"], data["parent_run_id"]) == (outcome.run_id, None)
    finally:
        engine.close()


async def test_a_childs_thread_is_no_conversation(db_url: str) -> None:
    async with served(db_url) as (engine, client):
        tree = await settled(engine, client)
        child = tree.researchers[0]
        thread = (await client.get(f"/v1/runs/{child.id}", headers=DANA)).json()["thread_id"]
        assert thread == child.thread_id != tree.root.thread_id
        before = await fingerprint(engine)

        listed = (await client.get("/v1/threads", headers=DANA)).json()["items"]
        assert [t["id"] for t in listed] == [tree.root.thread_id]
        refused(await client.get(f"/v1/threads/{thread}", headers=DANA), 404, "not_found")
        refused(await client.delete(f"/v1/threads/{thread}", headers=DANA), 404, "not_found")
        follow_up = {"question": "and then?", "thread_id": thread}
        refused(await client.post("/v1/runs", json=follow_up, headers=DANA), 422, "invalid_input")
        with pytest.raises(NotFound):
            await engine.get_thread(thread)
        with pytest.raises(NotFound):
            await engine.delete_thread(thread, user="dana")
        assert [t.id for t in await engine.list_threads(None)] == [tree.root.thread_id]
        assert await fingerprint(engine) == before
        assert engine.runner.store.get_run(child.id) is not None  # nothing was deleted


async def test_a_thread_is_busy_while_its_run_waits_for_its_children(db_url: str) -> None:
    async with served(db_url) as (engine, client):
        root = await engine.start_run("dana", "plan it")
        outcome = await engine.run_until_stop(root.id)  # its children are left unclaimed
        assert outcome.kind is StopKind.WAITING
        follow_up = {"question": "and then?", "thread_id": root.thread_id}

        busy = await client.post("/v1/runs", json=follow_up, headers=DANA)
        assert refused(busy, 409, "thread_busy", ("run_id",))["run_id"] == root.id
        deleted = await client.delete(f"/v1/threads/{root.thread_id}", headers=DANA)
        assert refused(deleted, 409, "thread_busy", ("run_id",))["run_id"] == root.id
        queued = await client.post(
            "/v1/runs", json={**follow_up, "if_busy": "enqueue"}, headers=DANA
        )
        assert queued.status_code == 202 and queued.json()["state"] == "queued", queued.text

        # Cancelling the waiting root answers its own JSON: its children, cancelled with it.
        cancelled = (await client.post(f"/v1/runs/{root.id}/cancel", headers=DANA)).json()
        assert cancelled["state"] == "cancelled"
        assert [c["state"] for c in cancelled["children"]] == ["cancelled", "cancelled"]
        assert [c["agent"] for c in cancelled["children"]] == ["researcher", "researcher"]
        assert (
            cancelled["budget"]["consumed_tree"]["steps"]
            == cancelled["budget"]["consumed"]["steps"]
        )  # its children took no step
        started = await engine.run_until_stop(queued.json()["id"])
        assert started.kind is StopKind.ANSWERED, started  # the thread is free again
