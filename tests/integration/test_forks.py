"""Forks (reference §12, "Steps and the fork's boundary") on both backends, in one
process: the step boundary, what a fork copies and what it does not (budget, ledger,
effects), its lineage and ``forked`` event, the forks of a run, continuing a fork, a dry-run
fork, the HTTP endpoint, and a run's page in the inbox with its lineage and its "fork from
step K" form (which forks only on a signed-in POST with the session's CSRF token and shows
the new run; a refused step says why (422) and forks nothing; a run that is not the
viewer's is not found).

No worker runs here: the tests carry runs with ``engine.run_until_stop``. The step boundary
itself is tests/unit/test_fork_boundary.py; forks with real processes are
tests/acceptance/test_fork_processes.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import agents
import downstream
import httpx
import inprocess
import pytest

from tether import Engine, MemoryNotifier, ScriptedModel, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.errors import InvalidInput, NotFound
from tether.runs import Run, RunState, run_to_json
from tether.store import CallStatus

KEYS = {"dana": "key-of-dana", "miguel": "key-of-miguel"}
DANA = {"Authorization": f"Bearer {KEYS['dana']}"}
MIGUEL = {"Authorization": f"Bearer {KEYS['miguel']}"}


async def suspended(engine: Engine) -> Run:
    """A run of dana's on the ``standard`` script, suspended on its send at step 3 (after
    a read and a deduplicating write with a read)."""
    outcome = await engine.ask("dana", "do the thing")
    assert outcome.kind is StopKind.SUSPENDED
    run = (await engine.get_run(outcome.run_id)).run
    assert run is not None and run.step == 3
    return run


async def trace(engine: Engine, run_id: str) -> list[str]:
    return [event.kind for event in await engine.events(run_id)]


async def stored(engine: Engine) -> list[tuple[Any, ...]]:
    """Everything a refused fork could have changed."""
    return [
        (r.id, r.state.value, r.updated_at, r.message_count, len(await engine.events(r.id)))
        for r in await engine.list_runs(None, limit=1000)
    ]


# -- what a fork is ------------------------------------------------------------------------


async def test_a_fork_holds_the_messages_through_step_k_exactly_with_a_fresh_budget(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    parent = await suspended(engine)
    before = (await engine.get_run(parent.id)).messages
    effects = downstream.effects()
    ledger = await engine.ledger(parent.id)

    fork = await engine.fork_run(parent.id, "dana", at_step=2)

    view = await engine.get_run(fork.id)
    # Through step 2: everything before the third assistant message.
    cut = [i for i, m in enumerate(before) if m["role"] == "assistant"][2]
    assert view.messages == before[:cut]
    assert [m["role"] for m in view.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "tool",
    ]  # fmt: skip
    assert fork.id != parent.id and fork.message_count == cut
    assert fork.state is RunState.HALTED and fork.halt_reason == "forked"
    assert fork.step == 2 and fork.forked_from == {"run_id": parent.id, "step": 2}
    assert fork.limits == parent.limits
    assert fork.budget.to_json() == {"steps": 0, "spend_usd": 0, "tool_calls": 0, "elapsed_ms": 0}
    assert parent.budget.steps == 3  # the parent's consumption stays the parent's
    assert fork.agent_version == parent.agent_version != ""
    assert (fork.user_id, fork.question, fork.route) == (
        parent.user_id,
        parent.question,
        parent.route,
    )
    assert fork.scope_snapshot == parent.scope_snapshot
    assert fork.versions == parent.versions
    assert fork.owner is None and fork.pending is None and fork.dry_run is False
    # Nothing re-executed: no effect, an empty ledger, the parent's ledger untouched.
    assert downstream.effects() == effects
    assert await engine.ledger(fork.id) == []
    assert await engine.ledger(parent.id) == ledger
    # The parent is as it was, still waiting on its send.
    after = await engine.get_run(parent.id)
    assert after.run.state is RunState.SUSPENDED and after.messages == before
    assert "forked" not in await trace(engine, parent.id)
    engine.close()


async def test_the_fork_event_records_where_from_which_step_dry_run_and_who(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    parent = await suspended(engine)
    fork = await engine.fork_run(parent.id, "dana", at_step=1, dry_run=True)
    events = await engine.events(fork.id)
    assert [e.kind for e in events] == ["forked"]
    assert events[0].data == {"from_run_id": parent.id, "step": 1, "dry_run": True, "by": "dana"}
    assert fork.dry_run is True
    shown = run_to_json(fork)
    assert shown["forked_from"] == {"run_id": parent.id, "step": 1} and shown["dry_run"] is True
    assert shown["halt_reason"] == "forked" and shown["state"] == "halted"
    assert "forked" not in await trace(engine, parent.id)
    engine.close()


async def test_runs_in_any_stopped_state_may_be_forked_and_a_fork_of_a_fork_points_to_it(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    answered = await engine.ask("dana", "work")
    assert answered.kind is StopKind.ANSWERED
    halted = await engine.ask("dana", "work", limits={"max_steps": 1})
    assert halted.kind is StopKind.HALTED
    cancelled = await engine.ask("dana", "work", limits={"max_steps": 2})
    await engine.cancel_run(cancelled.run_id, "dana")
    for run_id, steps in ((answered.run_id, 3), (halted.run_id, 1), (cancelled.run_id, 2)):
        # The last step of a run is a boundary too: every message is copied.
        fork = await engine.fork_run(run_id, "dana", at_step=steps)
        assert fork.message_count == ((await engine.get_run(run_id)).run).message_count
    first = await engine.fork_run(answered.run_id, "dana", at_step=2)
    second = await engine.fork_run(first.id, "dana", at_step=1)
    assert second.forked_from == {"run_id": first.id, "step": 1}
    assert [m["role"] for m in (await engine.get_run(second.id)).messages] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    engine.close()


async def test_forks_of_lists_a_runs_own_forks_oldest_first(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    parent = await suspended(engine)
    other = await suspended(engine)
    made = [await engine.fork_run(parent.id, "dana", at_step=k) for k in (2, 1, 2)]
    await engine.fork_run(other.id, "dana", at_step=1)
    await engine.fork_run(made[0].id, "dana", at_step=1)  # a grandchild: not the parent's
    assert [f.id for f in await engine.forks_of(parent.id)] == [f.id for f in made]
    assert [f.forked_from for f in await engine.forks_of(parent.id)] == [
        {"run_id": parent.id, "step": k} for k in (2, 1, 2)
    ]
    assert await engine.forks_of(made[1].id) == []
    engine.close()


# -- the boundary and the refusals ---------------------------------------------------------


@pytest.mark.parametrize(
    ("at_step", "message"),
    [
        (0, "between 1 and the run's step count (3)"),
        (-1, "between 1"),
        (4, "between 1 and the run's step count (3)"),
        # Step 3's send waits for its decision: it has no result, so it is no boundary.
        (3, "without a result"),
        (True, "an integer"),
        ("1", "an integer"),
        (1.0, "an integer"),
    ],
)
async def test_a_step_that_is_not_a_boundary_is_invalid_input_and_writes_nothing(
    db_url: str, at_step: Any, message: str
) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    parent = await suspended(engine)
    before = await stored(engine)
    with pytest.raises(InvalidInput, match=r"at_step|step 3") as refused:
        await engine.fork_run(parent.id, "dana", at_step=at_step)
    assert message in str(refused.value)
    assert refused.value.code == "invalid_input"
    assert await stored(engine) == before
    assert await engine.forks_of(parent.id) == []
    engine.close()


async def test_a_running_run_is_refused_and_another_users_or_a_missing_run_is_not_found(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    waiting = await engine.start_run("dana", "do the thing")  # running, waiting for a worker
    parent = await suspended(engine)
    before = await stored(engine)
    with pytest.raises(InvalidInput, match="running"):
        await engine.fork_run(waiting.id, "dana", at_step=1)
    claimed = await engine.runner.claim()  # running under an owner
    assert claimed is not None and claimed.id == waiting.id
    with pytest.raises(InvalidInput, match="running"):
        await engine.fork_run(waiting.id, "dana", at_step=1)
    with pytest.raises(NotFound) as theirs:
        await engine.fork_run(parent.id, "miguel", at_step=1)
    with pytest.raises(NotFound) as missing:
        await engine.fork_run("f" * 32, "dana", at_step=1)
    with pytest.raises(NotFound):
        await engine.fork_run("not a run id", "dana", at_step=1)
    assert str(theirs.value) == str(missing.value)
    assert [r[0] for r in await stored(engine)] == [r[0] for r in before]
    engine.close()


# -- continuing a fork ---------------------------------------------------------------------


async def test_a_continued_fork_goes_on_from_the_copied_messages_on_its_own_budget(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="work")  # lookup, then record (a write), answer
    parent = await engine.ask("dana", "work")
    assert parent.kind is StopKind.ANSWERED
    assert [tool for _, tool, _ in downstream.effects()] == ["record"]
    fork = await engine.fork_run(parent.run_id, "dana", at_step=2)  # just after the write
    assert len(downstream.effects()) == 1  # the fork executed nothing
    copied = (await engine.get_run(fork.id)).messages

    continued = await engine.continue_run(fork.id, "dana")
    assert continued.state is RunState.RUNNING and continued.halt_reason is None
    assert continued.limits == fork.limits.extended()  # the parent's limits are the base
    grant = [e for e in await engine.events(fork.id) if e.kind == "continued"]
    assert grant[0].data["previous_halt_reason"] == "forked"
    assert grant[0].data["old_limits"] == fork.limits.to_json()
    done = await engine.run_until_stop(fork.id)
    assert done.kind is StopKind.ANSWERED

    view = await engine.get_run(fork.id)
    assert view.messages[: len(copied)] == copied
    assert [m["role"] for m in view.messages[len(copied) :]] == ["assistant"]
    assert view.messages[-1]["content"] == "done"
    # One model turn of its own (step 3), no tool call: the write was not made again.
    assert view.run.step == 3 and view.run.budget.steps == 1 and view.run.budget.tool_calls == 0
    assert len(downstream.effects()) == 1 and await engine.ledger(fork.id) == []
    engine.close()


async def test_a_continued_fork_numbers_its_steps_from_k_plus_1_as_the_run_does(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="work")  # lookup, then record, answer
    parent = await engine.ask("dana", "work")
    fork = await engine.fork_run(parent.run_id, "dana", at_step=1)
    await engine.continue_run(fork.id, "dana")
    assert (await engine.run_until_stop(fork.id)).kind is StopKind.ANSWERED

    turns = [e for e in await engine.events(fork.id) if e.kind in ("model_turn", "answered")]
    assert [(e.kind, e.data["step"]) for e in turns] == [
        ("model_turn", 2),
        ("model_turn", 3),
        ("answered", 3),
    ]
    run = (await engine.get_run(fork.id)).run
    assert run.step == 3 and run.budget.steps == 2  # its own turns are what it consumed
    engine.close()


async def test_a_fork_before_a_write_makes_it_anew_under_its_own_key(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    parent = await engine.ask("dana", "work")
    fork = await engine.fork_run(parent.run_id, "dana", at_step=1)  # before the write
    await engine.continue_run(fork.id, "dana")
    assert (await engine.run_until_stop(fork.id)).kind is StopKind.ANSWERED
    (parent_key, _, _), (fork_key, tool, _) = downstream.effects()
    # A new run, a new idempotency key: the downstream sees the fork's own write.
    assert tool == "record" and parent_key != fork_key and fork.id in fork_key
    assert [e.tool for e in await engine.ledger(fork.id)] == ["record"]
    engine.close()


# -- dry-run forks -------------------------------------------------------------------------


def results(messages: list[dict[str, Any]]) -> list[Any]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


def would(tool_name: str, **arguments: Any) -> dict[str, Any]:
    return {"dry_run": True, "would_call": {"tool": tool_name, "arguments": arguments}}


async def test_a_dry_run_fork_replays_nothing_and_skips_the_writes_of_its_continuation(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="work")
    try:
        parent = (await engine.ask("dana", "go")).run_id  # a read, a write, an answer
        assert len(downstream.effects()) == 1
        fork = await engine.fork_run(parent, "dana", at_step=1, dry_run=True)
        assert fork.dry_run is True and fork.state is RunState.HALTED
        continued = await engine.continue_run(fork.id, "dana")
        assert continued.dry_run is True
        assert (await engine.run_until_stop(fork.id)).kind is StopKind.ANSWERED
        view = await engine.get_run(fork.id)
        assert results(view.messages)[-1] == would("record", item="a")
        assert [(e.tool, e.status) for e in await engine.ledger(fork.id)][-1] == (
            "record",
            CallStatus.SKIPPED,
        )
        assert view.run.budget.tool_calls == 1  # the fork's own skipped write only
        assert len(downstream.effects()) == 1  # the parent's write, never the fork's
    finally:
        engine.close()


# -- over HTTP -----------------------------------------------------------------------------


@asynccontextmanager
async def serving(url: str) -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    engine = inprocess.engine(url, script_name="standard")
    for user, key in KEYS.items():
        await engine.operator.add_user(user, key)
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            yield engine, c
    finally:
        engine.close()


async def test_post_fork_is_201_with_the_new_run_as_get_shows_it(db_url: str) -> None:
    async with serving(db_url) as (engine, client):
        parent = await suspended(engine)
        response = await client.post(
            f"/v1/runs/{parent.id}/fork", json={"at_step": 2, "dry_run": True}, headers=DANA
        )
        assert response.status_code == 201, response.text
        body = response.json()
        assert response.headers["Location"] == f"/v1/runs/{body['id']}"
        shown = await client.get(f"/v1/runs/{body['id']}", headers=DANA)
        assert body == shown.json()
        assert body["forked_from"] == {"run_id": parent.id, "step": 2}
        assert body["dry_run"] is True and body["state"] == "halted"
        assert body["halt_reason"] == "forked" and body["step"] == 2
        assert body["budget"]["consumed"]["steps"] == 0
        assert body["agent_version"] == parent.agent_version
        assert len(body["messages"]) == 7
        default = await client.post(f"/v1/runs/{parent.id}/fork", json={"at_step": 1}, headers=DANA)
        assert default.status_code == 201 and default.json()["dry_run"] is False


async def test_post_fork_refuses_bad_bodies_other_users_and_running_runs(db_url: str) -> None:
    async with serving(db_url) as (engine, client):
        parent = await suspended(engine)
        waiting = await engine.start_run("dana", "do the thing")
        before = await stored(engine)
        path = f"/v1/runs/{parent.id}/fork"
        for body in (
            None,
            {},
            {"at_step": 0},
            {"at_step": "1"},
            {"at_step": True},
            {"at_step": 1.5},
            {"at_step": 1, "dry_run": "yes"},
            {"at_step": 1, "extra": 1},
            {"at_step": 3},  # the pending send has no result
            {"at_step": 9},
        ):
            response = await client.post(path, json=body, headers=DANA)
            assert response.status_code == 422, (body, response.text)
            assert response.json()["error"] == "invalid_input", body
        running = await client.post(
            f"/v1/runs/{waiting.id}/fork", json={"at_step": 1}, headers=DANA
        )
        assert running.status_code == 422 and "running" in running.json()["message"]
        theirs = await client.post(path, json={"at_step": 1}, headers=MIGUEL)
        missing = await client.post(f"/v1/runs/{'f' * 32}/fork", json={"at_step": 1}, headers=DANA)
        assert theirs.status_code == 404 and theirs.json()["error"] == "not_found"
        assert theirs.json() == missing.json()
        assert await stored(engine) == before


# -- a run's page and its lineage in the inbox ---------------------------------------------

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
FORK_FORM = re.compile(r'<form method="post" action="/runs/([^"]+)/fork"')
AT_STEP = re.compile(r'name="at_step"[^>]*value="([^"]*)"')


@dataclass
class Web:
    engine: Engine
    keys: dict[str, str]
    app: Any

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://testserver"
        )

    async def halted(self, **limits: Any) -> str:
        """dana's run of the test agent's ``work`` script (a read, a write, an answer), halted."""
        outcome = await self.engine.ask("dana", "go", limits=limits)
        assert outcome.kind is StopKind.HALTED
        return outcome.run_id


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    engine = Engine(
        agent=agents.agent(),
        model=agents.script("work"),
        settings=Settings(database_url=db_url),
        notifier=MemoryNotifier(),
    )
    keys = {name: await engine.operator.add_user(name) for name in ("dana", "eve")}
    yield Web(engine=engine, keys=keys, app=create_app(engine))
    engine.close()


async def signed_in(web: Web, client: httpx.AsyncClient, user: str = "dana") -> str:
    """Sign ``user`` in; the session's CSRF token."""
    form = await client.get("/login", params={"next": "/"})
    found = CSRF.search(form.text)
    assert found
    done = await client.post(
        "/login", data={"key": web.keys[user], "csrf": found.group(1), "next": "/"}
    )
    assert done.status_code == 303
    inbox = await client.get("/")
    token = CSRF.search(inbox.text)
    assert token
    return token.group(1)


async def test_a_halted_runs_page_forks_it_into_a_dry_run_whose_page_shows_its_lineage(
    web: Web,
) -> None:
    parent = await web.halted(max_steps=1)  # the read of step 1 is done
    async with web.client() as client:
        csrf = await signed_in(web, client)
        shown = await client.get(f"/runs/{parent}")
        assert shown.status_code == 200
        assert web.engine.agent.agent_version in shown.text
        assert FORK_FORM.findall(shown.text) == [parent]
        assert AT_STEP.findall(shown.text) == ["1"]  # the run's step
        assert f'value="{csrf}"' in shown.text
        posted = await client.post(
            f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "1", "dry_run": "true"}
        )
        assert posted.status_code == 303
        (fork,) = await web.engine.forks_of(parent)
        assert posted.headers["location"] == f"/runs/{fork.id}"
        assert fork.dry_run is True and fork.forked_from == {"run_id": parent, "step": 1}
        assert fork.state is RunState.HALTED and fork.halt_reason == "forked"
        page = (await client.get(f"/runs/{fork.id}")).text
        assert re.search(
            rf'forked from\s*<a href="/runs/{parent}"><code>{parent}</code></a> at step 1', page
        )
        assert "Dry run" in page and web.engine.agent.agent_version in page
        back = (await client.get(f"/runs/{parent}")).text
        assert f'<a href="/runs/{fork.id}">' in back and "dry run" in back
        # Without the box ticked, a fork that executes its writes.
        await client.post(f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "1"})
        assert [f.dry_run for f in await web.engine.forks_of(parent)] == [True, False]


async def test_a_fork_post_without_the_sessions_csrf_token_or_session_forks_nothing(
    web: Web,
) -> None:
    parent = await web.halted(max_steps=1)
    form = {"at_step": "1", "dry_run": "true"}
    async with web.client() as anonymous:
        refused = await anonymous.post(f"/runs/{parent}/fork", data=form)
        assert refused.status_code == 303
        assert refused.headers["location"].startswith("/login")
    async with web.client() as client:
        await signed_in(web, client)
        missing = await client.post(f"/runs/{parent}/fork", data=form)
        forged = await client.post(f"/runs/{parent}/fork", data={**form, "csrf": "forged"})
        assert missing.status_code == 403 and forged.status_code == 403
        async with web.client() as other:
            foreign_csrf = await signed_in(web, other, "eve")
        crossed = await client.post(f"/runs/{parent}/fork", data={**form, "csrf": foreign_csrf})
        assert crossed.status_code == 403
    assert await web.engine.forks_of(parent) == []


async def test_a_refused_step_shows_why_on_the_runs_page_and_forks_nothing(web: Web) -> None:
    parent = await web.halted(max_steps=1)
    async with web.client() as client:
        csrf = await signed_in(web, client)
        for step, says in (("0", "between 1 and"), ("7", "between 1 and"), ("x", "whole number")):
            refused = await client.post(
                f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": step, "dry_run": "true"}
            )
            assert refused.status_code == 422, step
            assert says in refused.text and FORK_FORM.findall(refused.text) == [parent]
            assert AT_STEP.findall(refused.text) == [step]  # what was posted, to correct
            assert 'name="dry_run" value="true" checked' in refused.text
    assert await web.engine.forks_of(parent) == []


async def test_a_run_halted_inside_a_step_offers_the_last_step_whose_calls_have_results(
    web: Web,
) -> None:
    # Halted on the tool-call budget before step 2's write ran: step 2 is not a boundary.
    parent = await web.halted(max_tool_calls=1)
    async with web.client() as client:
        csrf = await signed_in(web, client)
        shown = (await client.get(f"/runs/{parent}")).text
        assert AT_STEP.findall(shown) == ["1"]
        inside = await client.post(f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "2"})
        assert inside.status_code == 422 and "without a result" in inside.text
        done = await client.post(f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "1"})
        assert done.status_code == 303
    assert len(await web.engine.forks_of(parent)) == 1


async def test_someone_elses_or_a_missing_run_is_not_found_and_an_answered_run_has_no_form(
    web: Web,
) -> None:
    parent = await web.halted(max_steps=1)
    answered = (await web.engine.ask("dana", "go")).run_id
    async with web.client() as client:
        eve = await signed_in(web, client, "eve")
        form = {"csrf": eve, "at_step": "1"}
        assert (await client.post(f"/runs/{parent}/fork", data=form)).status_code == 404
        bad_step = await client.post(f"/runs/{parent}/fork", data={**form, "at_step": "x"})
        assert bad_step.status_code == 404  # nothing says the run exists
        for missing in ("nope", "no%20such"):
            assert (await client.post(f"/runs/{missing}/fork", data=form)).status_code == 404
    assert await web.engine.forks_of(parent) == []
    async with web.client() as client:
        await signed_in(web, client)
        page = (await client.get(f"/runs/{answered}")).text
        assert FORK_FORM.findall(page) == [] and "Forks" not in page


async def test_a_failed_runs_page_offers_to_fork_it_before_the_step_it_failed_in(
    db_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("lookup", query="x")]},
        {"tool_calls": [agents.call("blind_write", item="z")]},
        {"content": "done"},
    ]
    engine = Engine(
        agent=agents.agent(),
        model=ScriptedModel(turns),
        settings=Settings(database_url=db_url),
        notifier=MemoryNotifier(),
    )
    try:
        web = Web(
            engine=engine,
            keys={"dana": await engine.operator.add_user("dana")},
            app=create_app(engine),
        )
        downstream.inject_failure("blind_write", "after_commit")  # cannot tell whether it ran
        outcome = await engine.ask("dana", "go")
        assert outcome.kind is StopKind.FAILED and outcome.reason == "unreconcilable"
        async with web.client() as client:
            csrf = await signed_in(web, client)
            shown = (await client.get(f"/runs/{outcome.run_id}")).text
            assert FORK_FORM.findall(shown) == [outcome.run_id]
            assert AT_STEP.findall(shown) == ["1"]  # step 2's write has no result
            form = {"csrf": csrf, "at_step": "1", "dry_run": "true"}
            done = await client.post(f"/runs/{outcome.run_id}/fork", data=form)
            assert done.status_code == 303
        (fork,) = await engine.forks_of(outcome.run_id)
        assert fork.dry_run and fork.forked_from == {"run_id": outcome.run_id, "step": 1}
    finally:
        engine.close()
