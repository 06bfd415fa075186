"""Forks (reference §12, §13 "steps and forks") on both backends: the step boundary, what a
fork copies and what it does not (budget, ledger, effects), its lineage and ``forked``
event, the forks of a run, continuing a fork, and the HTTP endpoint.

No worker runs here: the tests carry runs with ``engine.run_until_stop``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import downstream
import httpx
import inprocess
import pytest

from tether import Engine, StopKind
from tether.api.app import create_app
from tether.errors import InvalidInput, NotFound
from tether.runs import Run, RunState, run_to_json

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
        for r in await engine.list_runs(None, 1000)
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
    claimed = await engine._runner.claim()  # running under an owner
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


# -- over HTTP -----------------------------------------------------------------------------


@asynccontextmanager
async def serving(url: str) -> AsyncIterator[tuple[Engine, httpx.AsyncClient]]:
    engine = inprocess.engine(url, script_name="standard")
    for user, key in KEYS.items():
        await engine.add_user(user, key)
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
