"""The core engine on both backends: runs, budgets, suspension, fencing, arguments."""

from __future__ import annotations

import base64
import json
from typing import Any

import downstream
import inprocess
import pytest
import sqlalchemy as sa
from waiting import until

from tether import MemoryNotifier, StopKind
from tether._runtime.step.loop import drive
from tether._runtime.step.session import RunSession
from tether.errors import LeaseLost
from tether.messages import tool_result
from tether.store import Intent, Store
from tether.store.records import CallStatus
from tether.store.sql.schema import metadata
from tether.tokens import hash_token


async def test_scripted_run_answers_and_messages_read_back_identical(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="standard")
    outcome = await engine.ask("dana", "do the thing")
    assert outcome.kind is StopKind.SUSPENDED
    token = engine.runner.services.notifier.last().token  # type: ignore[attr-defined]
    await engine.resume_after_confirmation(token, "approve", "dana")
    final = await engine.run_until_stop(outcome.run_id)
    assert final.kind is StopKind.ANSWERED
    before = (await engine.get_run(outcome.run_id)).messages
    engine.close()

    reopened = inprocess.engine(db_url)
    after = await reopened.get_run(outcome.run_id)
    reopened.close()
    assert after.messages == before
    assert [m["role"] for m in after.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert after.run.state.value == "answered"
    assert after.messages[-1]["content"] == "done"


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"max_steps": 1}, "max_steps"),
        ({"max_spend_usd": 0.002}, "max_spend"),
        ({"max_tool_calls": 1}, "max_tool_calls"),
        ({"max_elapsed_ms": 40}, "max_elapsed"),
    ],
)
async def test_each_budget_bound_halts_with_its_reason_and_survives_reopen(
    db_url: str, limits: dict[str, float], reason: str
) -> None:
    downstream.set_world("lookup_ms", "60")
    engine = inprocess.engine(db_url)
    outcome = await engine.ask("dana", "go", limits=limits)
    assert outcome.kind is StopKind.HALTED
    assert outcome.reason == reason
    halted = (await engine.get_run(outcome.run_id)).run
    engine.close()

    reopened = inprocess.engine(db_url)
    again = (await reopened.get_run(outcome.run_id)).run
    reopened.close()
    assert again.state.value == "halted"
    assert again.halt_reason == reason
    assert again.budget == halted.budget
    assert again.budget.steps >= 1
    assert again.budget.spend_usd > 0


async def test_suspension_stores_only_the_tokens_hash(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    first = await engine.ask("dana", "send it")
    second = await engine.ask("dana", "send it again")
    assert first.kind is second.kind is StopKind.SUSPENDED
    tokens = [n.token for n in notifier.notices]
    assert len(set(tokens)) == 2
    for token in tokens:
        assert len(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))) >= 32
    dump = _dump_database(engine.runner.store)
    engine.close()
    for token in tokens:
        assert token not in dump
        assert hash_token(token) in dump


async def test_a_driver_whose_lease_was_taken_stops_before_it_executes(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="write_once", heartbeat_timeout_s=0.001)
    run = await engine.start_run("dana", "write")
    stale = engine.runner.store.claim_ready("worker-a", run.id)
    assert stale is not None
    taker = inprocess.engine(db_url, script_name="write_once", heartbeat_timeout_s=0.001)
    await until(lambda: engine.runner.store.now() - (stale.heartbeat_at or 0) > 0.01)
    recovered = await taker.runner.recover_orphans()
    assert [o.run_id for o in recovered] == [run.id]

    # The stale worker's session is fenced before it can run a write.
    taken = engine.runner.store.claim_ready("worker-b", run.id)
    assert taken is not None
    session = await RunSession.start(engine.runner.services, taken)
    engine.runner.store.claim_orphans(owner="thief", stale_after_s=-1, max_attempts=9, batch=5)
    outcome = await drive(session)
    assert outcome.kind is StopKind.LEASE_LOST
    assert downstream.effects() == []
    engine.close()
    taker.close()


async def test_a_fenced_out_turn_or_result_writes_nothing_at_all(db_url: str) -> None:
    engine = inprocess.engine(db_url, script_name="write_once")
    run = await engine.start_run("dana", "write")
    claimed = engine.runner.store.claim_ready("worker-a", run.id)
    assert claimed is not None
    call = {"id": "c1", "type": "function", "function": {"name": "write_once", "arguments": "{}"}}
    engine.runner.store.persist_turn(
        claimed.lease(),
        seq=2,
        message={"role": "assistant", "content": None, "tool_calls": [call]},
        spend_usd=0.5,
        elapsed_ms=3,
        intents=[Intent(tool_call_id="c1", tool="write_once", arguments={}, effect="write")],
        final=False,
        event={},
    )
    engine.runner.store.claim_orphans(owner="thief", stale_after_s=-1, max_attempts=9, batch=5)

    def stored() -> tuple[object, ...]:
        store = engine.runner.store
        return store.get_run(run.id), store.messages(run.id), store.events(run.id)

    before = stored()

    with pytest.raises(LeaseLost):
        engine.runner.store.persist_tool_result(
            claimed.lease(),
            seq=3,
            tool_call_id="c1",
            message=tool_result("c1", {"late": True}),
            status=CallStatus.ERROR,
            elapsed_ms=7,
            counted=True,
            event={"late": True},
        )
    with pytest.raises(LeaseLost):
        engine.runner.store.persist_turn(
            claimed.lease(),
            seq=3,
            message={"role": "assistant", "content": "late"},
            spend_usd=1.0,
            elapsed_ms=7,
            intents=[Intent(tool_call_id="c2", tool="write_once", arguments={}, effect="write")],
            final=True,
            event={},
        )
    assert stored() == before
    assert [(e.tool_call_id, e.status) for e in engine.runner.store.ledger(run.id)] == [
        ("c1", CallStatus.INTENT)
    ]
    engine.close()


async def test_invalid_tool_arguments_reach_the_model_as_an_error(db_url: str) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "lookup", "arguments": {"query": 3}}]},
        {"tool_calls": [{"name": "lookup", "arguments": "{not json"}]},
        {"tool_calls": [{"name": "nope", "arguments": {}}]},
        {"content": "ok"},
    ]
    engine = inprocess.engine(db_url, turns=turns)
    outcome = await engine.ask("dana", "go")
    assert outcome.kind is StopKind.ANSWERED
    results = [m for m in (await engine.get_run(outcome.run_id)).messages if m["role"] == "tool"]
    errors = [json.loads(m["content"])["error"] for m in results]
    assert errors == ["invalid_arguments", "invalid_arguments", "unknown_tool"]
    assert "query" in json.loads(results[0]["content"])["message"]
    engine.close()


async def test_each_ledger_entry_holds_the_result_the_model_saw_whatever_its_outcome(
    db_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "lookup", "arguments": {"query": "x"}}]},  # a read step
        {"tool_calls": [{"name": "record", "arguments": {"item": "a"}}]},  # a write
        {"tool_calls": [{"name": "nope", "arguments": {}}]},  # refused
        {"content": "ok"},
    ]
    engine = inprocess.engine(db_url, turns=turns)
    outcome = await engine.ask("dana", "go")
    assert outcome.kind is StopKind.ANSWERED
    messages = (await engine.get_run(outcome.run_id)).messages
    seen = {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}
    ledger = await engine.ledger(outcome.run_id)
    assert [(e.tool, e.status) for e in ledger] == [
        ("lookup", CallStatus.OK),
        ("record", CallStatus.OK),
        ("nope", CallStatus.ERROR),
    ]
    assert {e.tool_call_id: e.result for e in ledger} == seen
    assert ledger[0].result is not None and ledger[2].result["error"] == "unknown_tool"
    engine.close()


async def test_bytes_written_per_step_do_not_grow_with_history(db_url: str) -> None:
    downstream.set_world("pad", "8192")
    turns = [{"tool_calls": [{"name": "lookup", "arguments": {"query": "q"}}]}] * 80
    engine = inprocess.engine(db_url, turns=[*turns, {"content": "done"}])
    per_step: list[int] = []
    written = [0]

    @sa.event.listens_for(engine.runner.store.engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        # PostgreSQL sends each step write as one WITH … statement.
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "WITH")):
            written[0] += len(statement) + _param_bytes(parameters)

    @sa.event.listens_for(engine.runner.store.engine, "connect")
    def trace(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        # SQLite's step writes go to the driver's cursor (``store/backend/sqlite.py``): its trace
        # callback sees each statement with its values expanded.
        if engine.runner.store.dialect.name == "sqlite":
            dbapi_conn.set_trace_callback(sqlite_write)

    def sqlite_write(statement: str) -> None:
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE")):
            written[0] += len(statement)

    run = await engine.start_run("dana", "go", limits={"max_steps": 200, "max_tool_calls": 200})
    original = engine.runner.store.persist_turn

    def persist(*args, **kwargs):  # type: ignore[no-untyped-def]
        before = written[0]
        original(*args, **kwargs)
        if kwargs.get("results"):  # a read-only step: the turn and its result, one write
            per_step.append(written[0] - before)

    engine.runner.store.persist_turn = persist  # type: ignore[method-assign]
    outcome = await engine.run_until_stop(run.id)
    assert outcome.kind is StopKind.ANSWERED
    assert len(per_step) == 80
    early, late = per_step[5:10], per_step[-5:]
    assert max(late) <= max(early) * 1.05
    assert min(early) > 8192
    # The 8 KB result is written once, in its message: the ledger holds no copy of it.
    assert max(early) < 2 * 8192
    engine.close()


def _param_bytes(parameters: object) -> int:
    """Bytes of the bound values sent with a statement (psycopg's JSON wrapper unwrapped)."""
    if isinstance(parameters, dict):
        values = list(parameters.values())
    elif isinstance(parameters, list | tuple):
        values = [v for p in parameters for v in _values(p)]
    else:
        values = [parameters]
    return sum(len(str(getattr(v, "obj", v))) for v in values)


def _values(params: object) -> list[object]:
    if isinstance(params, dict):
        return list(params.values())
    if isinstance(params, list | tuple):
        return list(params)
    return [params]


def _dump_database(store: Store) -> str:
    parts = []
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(sa.select(table)):
                parts.append(json.dumps([str(v) for v in row], default=str))
    return "\n".join(parts)


@pytest.mark.parametrize(
    ("user", "question"),
    [
        ("dana", "a\x00b"),
        ("dana", "bad \ud800 surrogate"),
        ("da na", "ok"),
        ("", "ok"),
        ("dana", "   "),
        ("dana", 42),
    ],
)
async def test_bad_input_to_start_run_is_refused_and_stores_nothing(
    db_url: str, user: str, question: object
) -> None:
    from tether.errors import InvalidInput

    engine = inprocess.engine(db_url)
    with pytest.raises(InvalidInput):
        await engine.start_run(user, question)  # type: ignore[arg-type]
    assert list(await engine.list_runs()) == []
    engine.close()


async def test_ids_and_tokens_that_cannot_name_anything_are_refused_cleanly(db_url: str) -> None:
    from tether.errors import InvalidInput, NotFound, UnknownOrExpired

    engine = inprocess.engine(db_url)
    for bad in ("x" * 65, "../etc", "a b"):
        with pytest.raises(NotFound):
            await engine.get_run(bad)
        with pytest.raises(NotFound):
            await engine.cancel_run(bad, "dana")
        with pytest.raises(UnknownOrExpired):
            await engine.resume_after_confirmation(bad, "approve", "dana")
    for unstorable in ("a\x00b", "\ud800"):  # what no backend can store: invalid_input
        with pytest.raises(InvalidInput):
            await engine.get_run(unstorable)
        with pytest.raises(InvalidInput):
            await engine.cancel_run(unstorable, "dana")
        with pytest.raises(InvalidInput):
            await engine.resume_after_confirmation(unstorable, "approve", "dana")
    engine.close()
