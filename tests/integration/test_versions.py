"""Agent versions (reference §12) on both backends, in one process: what a run records, that
claims, recoveries, expiries and decisions take only the versions a process serves, the
worker registry (and the gauge of live worker processes) and stranded runs, migrations, and
a decision whose tool is gone."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import agents
import downstream
import heartbeats
import pytest
import sqlalchemy as sa
import versioned
from waiting import until

from tether import Agent, Engine, StopKind, Worker
from tether.api.metrics import render
from tether.errors import (
    AlreadyFinished,
    InvalidInput,
    NotFound,
    PendingToolUnavailable,
    WrongVersion,
)
from tether.runs import RunState, run_to_json
from tether.store.sql.schema import workers

SEND: list[dict[str, Any]] = [{"tool_calls": [agents.call("send", item="b")]}, {"content": "sent"}]


def _token(engine: Engine) -> str:
    return str(engine.runner.services.notifier.last().token)  # type: ignore[attr-defined]


async def test_a_run_records_its_agent_version_and_shows_it(db_url: str) -> None:
    engine = versioned.engine(db_url, versioned.v1())
    try:
        run = await engine.start_run("dana", "hello")
        view = await engine.get_run(run.id)
        assert view.run.agent_version == "kit@v1"
        assert view.run.versions["agent"] == "kit@v1"
        shown = run_to_json(view.run)
        assert shown["agent_version"] == "kit@v1"
        assert shown["forked_from"] is None and shown["dry_run"] is False
    finally:
        engine.close()


async def test_an_engine_claims_only_the_versions_it_serves(db_url: str) -> None:
    old = versioned.engine(db_url, versioned.v1())
    new = versioned.engine(db_url, versioned.v2())
    accepting = versioned.engine(db_url, versioned.v2(), accept_versions=("kit@v1",))
    try:
        run = await old.start_run("dana", "hello")
        assert await new.runner.claim() is None
        with pytest.raises(WrongVersion) as refused:
            await new.run_until_stop(run.id)
        assert refused.value.details["agent_version"] == "kit@v1"
        stored = (await new.get_run(run.id)).run
        assert stored is not None and stored.owner is None and stored.lease_epoch == 0
        outcome = await accepting.run_until_stop(run.id)
        assert outcome.kind is StopKind.ANSWERED
        view = await accepting.get_run(run.id)
        assert versioned.served_by(view.messages) == ["kit@v2", "kit@v2"]
        assert view.run.agent_version == "kit@v1"  # accepting is not migrating
    finally:
        for engine in (old, new, accepting):
            engine.close()


async def test_orphans_and_expiries_of_another_version_are_left_alone(db_url: str) -> None:
    old = versioned.engine(db_url, versioned.v1(), heartbeat_timeout_s=0.05)
    new = versioned.engine(
        db_url, versioned.v2(), heartbeat_timeout_s=0.05, suspension_ttl_min=0.0001
    )
    try:
        orphan = await old.start_run("dana", "work")
        claimed = await old.runner.claim()
        assert claimed is not None and claimed.id == orphan.id
        old.runner.services.heartbeat.stop()  # its owner "dies": the heartbeat goes stale
        await until(
            lambda: heartbeats.stale(new.runner.store, orphan.id, 0.05), what="a stale heartbeat"
        )
        assert (await new.runner.claim_orphans(10)).claimed == []
        _, any_orphan = await new.runner.orphan_census()
        assert not any_orphan
        waiting = versioned.engine(db_url, versioned.v1(), turns=SEND, suspension_ttl_min=0.0001)
        suspended = await waiting.ask("dana", "send it")
        waiting.close()
        assert suspended.kind is StopKind.SUSPENDED
        await until(lambda: _expired(new, suspended.run_id), what="the window to pass")
        assert await new.runner.expire_suspended() == []
        assert ((await new.get_run(suspended.run_id)).run).state is RunState.SUSPENDED
        assert suspended.run_id in await old.runner.expire_suspended()
    finally:
        old.close()
        new.close()


def _expired(engine: Engine, run_id: str) -> bool:
    """The run's approval window has passed by the database's clock."""
    now, _ = engine.runner.store.orphan_census(stale_after_s=0.05)
    run = engine.runner.store.get_run(run_id)
    return run is not None and run.expires_at is not None and now > run.expires_at


async def test_stranded_runs_are_those_no_live_worker_serves(db_url: str) -> None:
    old = versioned.engine(db_url, versioned.v1(), heartbeat_timeout_s=600)
    try:
        queued = await old.start_run("dana", "queued")
        halted = await old.start_run("dana", "halted", limits={"max_steps": 1})
        assert (await old.run_until_stop(halted.id)).kind is StopKind.HALTED
        suspended = (await _suspended(db_url)).run_id
        assert await _stranded_ids(old) == {queued.id, suspended}  # no worker at all
        assert await old.operator.count_stranded() == 2
        old.runner.store.register_worker("w-old", ["kit@v1", "kit@v0"], ["send"])
        assert await _stranded_ids(old) == set()
        assert await old.operator.count_stranded() == 0
        assert old.runner.store.beat_worker("w-old") is True
        old.runner.store.leave("w-old")
        assert old.runner.store.beat_worker("w-old") is False
        assert await _stranded_ids(old) == {queued.id, suspended}
        old.runner.store.register_worker("w-new", ["kit@v2"], ["send"])
        assert old.runner.store.live_versions(stale_after_s=600) == ["kit@v2"]
        assert await old.operator.count_stranded() == 2
        with pytest.raises(InvalidInput):
            await old.operator.stranded_runs(0)
    finally:
        old.close()


async def _worker_gauge(engine: Engine) -> dict[str, float]:
    """The ``tether_worker_processes`` samples of a scrape, by worker id."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await render(engine))[0].decode()
    return {
        s.labels["worker"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tether_worker_processes"
    }


async def test_the_gauge_of_worker_processes_lists_each_live_worker_once(db_url: str) -> None:
    engine = versioned.engine(db_url, versioned.v1(), heartbeat_timeout_s=600)
    store = engine.runner.store
    try:
        # An engine without a worker (`tether serve --workers 0`) is no worker process.
        assert await _worker_gauge(engine) == {}
        store.register_worker("h:1:a", ["kit@v1", "kit@v0"], ["send"])  # two rows, one line
        store.register_worker("h:2:b", ["kit@v1"], ["send"])
        store.register_worker("h:3:c", ["kit@v1"], ["send"])
        store.leave("h:2:b")
        with store.engine.begin() as conn:  # h:3:c fell silent an hour ago
            silent = workers.c.heartbeat_at - 3600
            conn.execute(
                sa.update(workers).where(workers.c.worker_id == "h:3:c").values(heartbeat_at=silent)
            )
        assert await _worker_gauge(engine) == {"h:1:a": 1.0}
        worker = Worker(engine, concurrency=1)
        running = asyncio.create_task(worker.run(reap=False))
        mine = engine.runner.worker_id
        await until(lambda: _listed(engine, mine), what="the running worker listed")
        worker.stop()
        await running
        assert await _worker_gauge(engine) == {"h:1:a": 1.0}  # it left as it stopped
    finally:
        engine.close()


async def _listed(engine: Engine, worker_id: str) -> bool:
    return await _worker_gauge(engine) == {"h:1:a": 1.0, worker_id: 1.0}


async def _suspended(db_url: str, agent: Agent | None = None) -> Any:
    engine = versioned.engine(db_url, agent or versioned.v1(), turns=SEND)
    try:
        outcome = await engine.ask("dana", "send it")
        assert outcome.kind is StopKind.SUSPENDED
        return dataclasses.replace(outcome, answer=_token(engine))
    finally:
        engine.close()


async def _stranded_ids(engine: Engine) -> set[str]:
    return {run.id for run in await engine.operator.stranded_runs()}


async def test_a_decision_on_another_version_is_wrong_version_and_claims_nothing(
    db_url: str,
) -> None:
    old = versioned.engine(db_url, versioned.v1(), turns=SEND)
    new = versioned.engine(db_url, versioned.v2(), turns=SEND)
    try:
        outcome = await old.ask("dana", "send it")
        token = _token(old)
        before = (await old.get_run(outcome.run_id)).run
        with pytest.raises(WrongVersion) as refused:
            await new.resume_after_confirmation(token, "approve", "dana")
        assert refused.value.details["agent_version"] == "kit@v1"
        after = (await old.get_run(outcome.run_id)).run
        assert after == before  # nothing claimed, the token still works
        assert not [e for e in await old.events(outcome.run_id) if e.kind == "approved"]
        result = await old.resume_after_confirmation(token, "approve", "dana")
        assert result.outcome.value == "executed"
    finally:
        old.close()
        new.close()


async def test_migrate_moves_a_waiting_run_with_a_recorded_event(db_url: str) -> None:
    old = versioned.engine(db_url, versioned.v1())
    new = versioned.engine(db_url, versioned.v2())
    try:
        run = await old.start_run("dana", "hello")
        await new.runner.registration().join()  # a live worker of v2
        moved = await new.operator.move_run(run.id, "kit@v2", user="ops", why="deploy 42")
        assert moved.agent_version == "kit@v2"
        migrated = [e for e in await new.events(run.id) if e.kind == "migrated"]
        assert [e.data for e in migrated] == [
            {"by": "ops", "why": "deploy 42", "from_version": "kit@v1", "to_version": "kit@v2"}
        ]
        assert await old.runner.claim() is None  # the old version no longer takes it
        outcome = await new.run_until_stop(run.id)
        assert outcome.kind is StopKind.ANSWERED
    finally:
        old.close()
        new.close()


async def test_migrate_refuses_what_it_cannot_do_and_changes_nothing(db_url: str) -> None:
    old = versioned.engine(db_url, versioned.v1())
    new = versioned.engine(db_url, versioned.v2())
    try:
        run = await old.start_run("dana", "hello")
        await new.runner.registration().join()
        with pytest.raises(InvalidInput, match="no live worker serves agent version 'kit@v9'"):
            await new.operator.move_run(run.id, "kit@v9", user="ops")
        with pytest.raises(InvalidInput, match="already on"):
            await old.operator.move_run(run.id, "kit@v1", user="ops")
        with pytest.raises(InvalidInput):
            await new.operator.move_run(run.id, "kit@v2", user="not a user id!")
        with pytest.raises(NotFound):
            await new.operator.move_run("0" * 32, "kit@v2", user="ops")
        claimed = await old.runner.claim()  # a live owner carries it now
        assert claimed is not None
        with pytest.raises(InvalidInput, match="live worker"):
            await new.operator.move_run(run.id, "kit@v2", user="ops")
        assert (await old.runner.carry(claimed)).kind is StopKind.ANSWERED
        with pytest.raises(AlreadyFinished):
            await new.operator.move_run(run.id, "kit@v2", user="ops")
        assert ((await new.get_run(run.id)).run).agent_version == "kit@v1"
        assert not [e for e in await new.events(run.id) if e.kind == "migrated"]
    finally:
        old.close()
        new.close()


async def test_migrate_refuses_a_version_without_the_pending_tool(db_url: str) -> None:
    suspended = await _suspended(db_url)
    no_send = versioned.engine(db_url, versioned.v3())
    try:
        await no_send.runner.registration().join()
        with pytest.raises(PendingToolUnavailable) as refused:
            await no_send.operator.move_run(suspended.run_id, "kit@v3", user="ops")
        assert refused.value.code == "tool_unavailable"
        assert refused.value.details["tool"] == "send"
        run = (await no_send.get_run(suspended.run_id)).run
        assert run is not None and run.agent_version == "kit@v1"
        assert run.state is RunState.SUSPENDED
    finally:
        no_send.close()


async def test_migrate_needs_only_a_live_worker_of_the_version_not_its_code(db_url: str) -> None:
    """The ops's process loads no code of the target version (reference §12): the
    version's live workers registered their tools, and the pending tool is checked
    against those."""
    suspended = await _suspended(db_url)
    ops = versioned.engine(db_url, versioned.v1())  # serves v1 only
    v2_worker = versioned.engine(db_url, versioned.v2())
    v3_worker = versioned.engine(db_url, versioned.v3())  # has no ``send``
    try:
        with pytest.raises(InvalidInput, match="no live worker serves"):
            await ops.operator.move_run(suspended.run_id, "kit@v2", user="ops")
        await v3_worker.runner.registration().join()
        with pytest.raises(PendingToolUnavailable) as refused:
            await ops.operator.move_run(suspended.run_id, "kit@v3", user="ops")
        assert refused.value.details["tool"] == "send"
        await v2_worker.runner.registration().join()
        moved = await ops.operator.move_run(suspended.run_id, "kit@v2", user="ops", why="deploy")
        assert moved.agent_version == "kit@v2" and moved.state is RunState.SUSPENDED
        result = await v2_worker.resume_after_confirmation(suspended.answer, "approve", "dana")
        assert result.outcome.value == "executed"
        await v2_worker.runner.registration().leave()
        other = await _suspended(db_url)
        with pytest.raises(InvalidInput, match="no live worker serves"):  # it stopped
            await ops.operator.move_run(other.run_id, "kit@v2", user="ops")
    finally:
        ops.close()
        v2_worker.close()
        v3_worker.close()


async def test_a_version_is_refused_when_one_of_its_live_workers_lacks_the_pending_tool(
    db_url: str,
) -> None:
    """A decision may land on any live worker of the version: each must have the tool."""
    suspended = await _suspended(db_url)
    operator = versioned.engine(db_url, versioned.v1())
    try:
        operator.runner.store.register_worker("w-a", ["kit@v2"], ["send", "lookup"])
        operator.runner.store.register_worker("w-b", ["kit@v2"], ["lookup"])
        with pytest.raises(PendingToolUnavailable):
            await operator.operator.move_run(suspended.run_id, "kit@v2", user="ops")
        operator.runner.store.leave("w-b")
        moved = await operator.operator.move_run(suspended.run_id, "kit@v2", user="ops")
        assert moved.agent_version == "kit@v2"
    finally:
        operator.close()


async def test_a_decision_whose_tool_is_gone_halts_the_run_tool_unavailable(
    db_url: str,
) -> None:
    suspended = await _suspended(db_url)
    # A v3 process that accepts v1 runs, but has no ``send`` any more.
    no_send = versioned.engine(db_url, versioned.v3(), accept_versions=("kit@v1",))
    try:
        with pytest.raises(PendingToolUnavailable):
            await no_send.resume_after_confirmation(suspended.answer, "approve", "dana")
        view = await no_send.get_run(suspended.run_id)
        assert view.run.state is RunState.HALTED
        assert view.run.halt_reason == "tool_unavailable"
        last = view.messages[-1]
        assert last["role"] == "tool" and "tool_unavailable" in last["content"]
        assert downstream.effects() == []  # the send never ran
        kinds = [e.kind for e in await no_send.events(suspended.run_id)]
        assert kinds[-3:] == ["approved", "tool_result", "halted"]
    finally:
        no_send.close()


async def test_over_http_a_decision_of_another_version_is_a_409_and_metrics_count_it(
    db_url: str,
) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tether.api.app import create_app

    suspended = await _suspended(db_url)
    engine = versioned.engine(db_url, versioned.v2())
    await engine.operator.add_user("dana", "key-of-dana")
    app = create_app(engine, public_url="http://tether.test")
    dana = {"Authorization": "Bearer key-of-dana"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://tether.test"
        ) as client:
            answer = await client.post(
                f"/v1/approvals/{suspended.answer}", json={"decision": "approve"}, headers=dana
            )
            assert answer.status_code == 409, answer.text
            body = answer.json()
            assert body["ok"] is False and body["error"] == "wrong_version"
            assert body["agent_version"] == "kit@v1" and "tether runs migrate" in body["message"]
            shown = (await client.get(f"/v1/runs/{suspended.run_id}", headers=dana)).json()
            assert shown["state"] == "suspended" and shown["agent_version"] == "kit@v1"
            text = (await client.get("/metrics")).text
        gauges = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "tether_runs_stranded"
        ]
        assert gauges == [1.0]  # the suspended v1 run: no worker serves v1
    finally:
        engine.close()
