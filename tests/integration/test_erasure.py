"""Erasing a user's data (reference §20) on both backends, through the engine's operator
and ``DELETE /v1/users/me/data``: nothing of the user is left in any table (their markers
in questions, tool arguments, results, previews, a decline reason, a schedule's question,
and their name but as its digest), other users' data is whole, the counts are right, a
second erasure and an unknown name answer zeros, the name is free again, and a worker
carrying one of their runs writes nothing after. The erasure crashed midway and finished
from another process: ``tests/acceptance/test_erasure_crash.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import agents
import httpx
import inprocess
import pytest
import sealed
import sqlalchemy as sa
from erased_data import marker, mentions
from store_runs import new_run

from tether import Agent, Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.errors import InvalidInput, LeaseLost, NotFound
from tether.runs import RunState
from tether.scope import Scope
from tether.store.erasure import digest_of
from tether.store.sql.schema import audit, decisions

YEARLY = "0 0 1 1 *"


async def _reviewers(user_id: str) -> Scope:
    """Everyone's calls may be decided by the group ``reviewers``, which everyone is in:
    the scope names a group, never a person."""
    base = await agents.resolve(user_id)
    return Scope(
        user_id=user_id,
        permissions=base.permissions,
        approvers=frozenset({"group:reviewers"}),
        groups=frozenset({"reviewers"}),
    )


def _agent() -> Agent:
    return Agent(
        name="kit",
        system_prompt="You are a test agent.",
        tools=(agents.lookup, agents.send),
        resolve_scope=_reviewers,
    )


@dataclass
class People:
    """erin (to be erased), her markers and runs, and olga's run that erin decided."""

    erin: str
    mark: str
    engine: Engine
    others: Engine
    notifier: MemoryNotifier
    erins_runs: set[str]
    olgas_run: str


def _turns(mark: str) -> list[dict[str, object]]:
    """A read and a send carrying ``mark`` in their arguments (so in results and the
    preview), then an answer with it."""
    return [
        {"tool_calls": [agents.call("lookup", query=mark)]},
        {"tool_calls": [agents.call("send", item=mark)]},
        {"content": f"answer {mark}"},
    ]


@pytest.fixture
async def people(db_url: str, request: pytest.FixtureRequest) -> AsyncIterator[People]:
    """The story; its content sealed at rest (reference §20) when the test asks ``sealed``."""
    mark, erin = marker(), "erin-" + marker()
    notifier = MemoryNotifier()
    keys = sealed.ring(sealed.entry("k1")) if getattr(request, "param", None) == "sealed" else None
    engine = inprocess.engine_for(db_url, _agent(), _turns(mark), notifier=notifier, keyring=keys)
    others = inprocess.engine_for(
        db_url, _agent(), _turns("plain"), notifier=notifier, purge_batch=2, keyring=keys
    )
    for user in (erin, "olga"):
        await engine.operator.add_user(user)
    declined = await engine.ask(erin, f"question {mark}")
    assert declined.kind is StopKind.SUSPENDED
    token = notifier.last(declined.run_id).token
    await engine.resume_after_confirmation(token, "decline", erin, reason=f"no {mark}")
    assert (await engine.run_until_stop(declined.run_id)).kind is StopKind.ANSWERED
    thread = (await engine.get_run(declined.run_id)).run.thread_id
    # The scripted model plays past its turns in a follow-up: the final answer at once.
    follow_up = await engine.ask(erin, f"again {mark}", thread_id=thread)
    suspended = await engine.ask(erin, f"suspended {mark}")
    assert (follow_up.kind, suspended.kind) == (StopKind.ANSWERED, StopKind.SUSPENDED)
    carried = await engine.start_run(erin, f"carried {mark}")
    await engine.add_schedule(erin, YEARLY, f"scheduled {mark}")
    # olga's run, which erin decides as one of the reviewers.
    olgas = await others.ask("olga", "olga's question")
    assert olgas.kind is StopKind.SUSPENDED
    olgas_token = notifier.last(olgas.run_id).token
    await others.resume_after_confirmation(olgas_token, "approve", erin)
    assert (await others.run_until_stop(olgas.run_id)).kind is StopKind.ANSWERED
    yield People(
        erin=erin,
        mark=mark,
        engine=engine,
        others=others,
        notifier=notifier,
        erins_runs={declined.run_id, follow_up.run_id, suspended.run_id, carried.id},
        olgas_run=olgas.run_id,
    )
    engine.close()
    others.close()


@pytest.mark.parametrize("people", ["clear", "sealed"], indirect=True)
async def test_an_erasure_leaves_nothing_of_the_user_in_any_table(
    people: People, db_url: str
) -> None:
    engine, erin = people.engine, people.erin
    if people.engine.settings.keyring is None:
        assert mentions(db_url, [people.mark]) != []  # the markers are there to be found
    else:  # sealed: no content anywhere, the name only where it is an id
        assert mentions(db_url, [people.mark]) == []
    olga_before = [e.kind for e in await engine.events(people.olgas_run)]
    erased = await engine.operator.erase_user(erin)
    # Four runs in three threads (the first and its follow-up share one), those still
    # going cancelled first; the schedule.
    assert erased.to_json() == {"runs": 4, "threads": 3, "schedules": 1}
    assert mentions(db_url, [people.mark, erin]) == []
    # olga's run is whole; erin's decision in it names her digest only.
    olga = (await engine.get_run(people.olgas_run)).run
    assert olga.state is RunState.ANSWERED
    assert [e.kind for e in await engine.events(people.olgas_run)] == olga_before
    digest = digest_of(erin)
    store = engine.runner.store
    with store.engine.connect() as conn:
        deciders = conn.execute(sa.select(decisions.c.decided_by)).scalars().all()
        records = conn.execute(sa.select(audit).order_by(audit.c.seq)).all()
    assert deciders == [digest]
    approved = [e for e in await engine.events(people.olgas_run) if e.kind == "approved"]
    assert [e.data["by"] for e in approved] == [digest]
    # erin's own records keep seq, at, kind and outcome only; olga's keep all but erin's name.
    own = [r for r in records if r.user_id == digest]
    assert own and all(
        (r.run_id, r.root_run_id, r.tool, r.tool_call_id, r.digest, r.decision, r.reason)
        == (None,) * 7
        for r in own
    )
    assert own[-1].kind == "erased" and own[-1].outcome == "erased" and own[-1].by is None
    olgas = [r for r in records if r.user_id == "olga"]
    assert olgas and all(r.by == digest and r.run_id == people.olgas_run for r in olgas)
    with pytest.raises(NotFound):
        await engine.get_run(next(iter(people.erins_runs)))


async def test_erasing_again_or_an_unknown_name_answers_zeros_and_the_name_is_free(
    people: People,
) -> None:
    operator = people.engine.operator
    first = await operator.erase_user(people.erin)
    assert first.runs == 4
    assert (await operator.erase_user(people.erin)).to_json() == dict.fromkeys(
        ("runs", "threads", "schedules"), 0
    )
    unknown = await operator.erase_user("nobody-at-all")
    assert (unknown.runs, unknown.threads, unknown.schedules) == (0, 0, 0)
    assert "nobody-at-all" not in {u["name"] for u in await operator.list_users()}
    # The name is free: added again, it starts afresh with nothing of before.
    await operator.add_user(people.erin)
    assert (await people.engine.list_runs(people.erin)).runs == []
    for bad in ("", "a b", "x" * 129, "erin/../x"):
        with pytest.raises(InvalidInput):
            await operator.erase_user(bad)


async def test_a_removed_user_is_erased_and_their_name_freed(people: People) -> None:
    operator = people.engine.operator
    removal = await operator.remove_user(people.erin)
    assert len(removal.runs_cancelled) == 2  # the run suspended, the run ready
    with pytest.raises(InvalidInput, match="tether users erase"):
        await operator.add_user(people.erin)
    erased = await operator.erase_user(people.erin)
    # The schedule went with the removal; this erasure deleted the runs and threads.
    assert (erased.runs, erased.threads, erased.schedules) == (4, 3, 0)
    await operator.add_user(people.erin)


async def test_erasing_through_the_api_deletes_the_callers_data_and_key(
    people: People, db_url: str
) -> None:
    key = await people.engine.operator.add_user("fay")
    await people.engine.start_run("fay", f"fay's {people.mark}")
    transport = httpx.ASGITransport(app=create_app(people.others))
    async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as client:
        headers = {"Authorization": f"Bearer {key}"}
        response = await client.delete("/v1/users/me/data", headers=headers)
        assert response.status_code == 200, response.text
        assert response.json() == {"erased": {"runs": 1, "threads": 1, "schedules": 0}}
        again = await client.delete("/v1/users/me/data", headers=headers)
        assert again.status_code == 401 and again.json()["error"] == "unauthenticated"
    assert mentions(db_url, ["fay"]) == []
    # Self-erased: the erased record's ``by`` is the caller's digest.
    with people.engine.runner.store.engine.connect() as conn:
        last = conn.execute(sa.select(audit).order_by(audit.c.seq.desc()).limit(1)).one()
    assert (last.kind, last.user_id, last.by) == ("erased", digest_of("fay"), digest_of("fay"))
    assert len(await people.engine.list_runs(people.erin)) == 4  # others untouched


async def test_a_worker_carrying_a_run_of_the_user_writes_nothing_after_and_serves_others(
    people: People,
) -> None:
    store = people.engine.runner.store
    running = new_run(store, people.erin)
    taken = store.claim_ready("a-worker", running)
    assert taken is not None
    lease = taken.lease()
    olgas_next = await people.others.start_run("olga", "next")
    await people.engine.operator.erase_user(people.erin)
    # Its next write is refused, and the run's rows stay gone.
    with pytest.raises(LeaseLost):
        store.add_event(lease, "model_turn", {"step": 1})
    assert store.get_run(running) is None and store.events(running) == []
    # The same worker goes on with another user's run.
    outcome = await people.others.run_until_stop(olgas_next.id)
    assert outcome.kind is StopKind.SUSPENDED


async def test_an_erasure_of_several_batches_deletes_every_run(db_url: str) -> None:
    engine = inprocess.tiny_engine(db_url, purge_batch=3)
    for i in range(7):
        await engine.ask("gil", f"q{i}")
    await engine.ask("hal", "kept")
    erased = await engine.operator.erase_user("gil")
    assert (erased.runs, erased.threads) == (7, 7)
    assert [r.user_id for r in await engine.list_runs()] == ["hal"]
    engine.close()
