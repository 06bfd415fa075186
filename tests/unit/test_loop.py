"""The step loop (``tether._runtime.step.loop``) on a real SQLite store: ``drive`` carries a
claimed run to its next stop and returns how it stopped (answered, suspended, halted,
failed, released, abandoned, lease lost); it never raises for control flow. ``carry`` starts
the session first; ``batches`` groups the calls that may run together; ``process`` carries
out a human decision once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import call
from bench import Bench
from waiting import until

from tether import GuardResult, Scope, ScriptedModel, ToolContext, tool
from tether._runtime.step import loop
from tether._runtime.step.session import RunSession
from tether.errors import DatabaseUnavailable, ModelError
from tether.messages import ToolCall
from tether.models.base import Message, Model, ModelResponse, ToolSpec
from tether.results import StopKind
from tether.runs import RunState
from tether.store import Decision

ran: list[str] = []


@tool
def look(query: str) -> dict[str, str]:
    """A read."""
    ran.append(f"look:{query}")
    return {"answer": f"about {query}"}


@tool(effect="write", dedupes=True)
def put(ctx: ToolContext, item: str) -> dict[str, str]:
    """A write the downstream deduplicates."""
    ran.append(f"put:{item}")
    return {"item": item}


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"item": args.item}


@tool(effect="write", dedupes=True, needs_confirmation=True, preview=_preview)
def send(ctx: ToolContext, item: str) -> dict[str, str]:
    """A write a human confirms."""
    ran.append(f"send:{item}")
    return {"sent": item}


@tool(needs_confirmation=True)
def peek(query: str) -> dict[str, str]:
    """A read a human confirms."""
    ran.append(f"peek:{query}")
    return {"seen": query}


@tool
def broken(query: str) -> dict[str, str]:
    """A read with a bug."""
    raise RuntimeError("a bug in the tool")


async def _crashing_guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    raise RuntimeError("a bug in the guard")


@tool(effect="write", dedupes=True, guard=_crashing_guard)
def guarded(ctx: ToolContext, item: str) -> dict[str, str]:
    """A write whose guard has a bug."""
    ran.append(f"guarded:{item}")
    return {"item": item}


TOOLS = (look, put, send, peek, broken, guarded)


@pytest.fixture(autouse=True)
def _nothing_ran_yet() -> None:
    ran.clear()


class Counting(Model):
    """A scripted model that counts how often it was asked."""

    name = "scripted:counting"

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.asked = 0
        self._script = ScriptedModel(turns)

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.asked += 1
        return await self._script.request(messages, tools)


class Failing(Model):
    """A model whose provider fails, transiently or not."""

    name = "failing"

    def __init__(self, *, transient: bool) -> None:
        self.transient = transient

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        raise ModelError("the provider is down", status=503, transient=self.transient)


def _answers(run_messages: list[Message]) -> list[Any]:
    return [json.loads(m["content"]) for m in run_messages if m.get("role") == "tool"]


# -- the stops -----------------------------------------------------------------------------


async def test_a_run_that_answers_returns_answered_with_the_answer(sqlite_url: str) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("look", query="x")]},
        {"tool_calls": [call("put", item="a")]},
        {"content": "forty-two"},
    ]
    with Bench(sqlite_url, *TOOLS, turns=turns) as bench:
        session = await bench.session()

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.ANSWERED and outcome.answer == "forty-two"
        run = bench.stored(session.run.id)
        assert run.state is RunState.ANSWERED and run.owner is None
        assert (run.budget.steps, run.budget.tool_calls) == (3, 2)
        assert ran == ["look:x", "put:a"]
        assert _answers(bench.messages(run.id)) == [{"answer": "about x"}, {"item": "a"}]


async def test_a_call_that_needs_confirmation_returns_suspended_with_its_notice(
    sqlite_url: str,
) -> None:
    turns = [{"tool_calls": [call("look", query="x")]}, {"tool_calls": [call("send", item="b")]}]
    with Bench(sqlite_url, *TOOLS, turns=turns) as bench:
        session = await bench.session()

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.SUSPENDED and outcome.notice is not None
        assert outcome.notice.preview == {"item": "b"} and bench.notifier.notices == [
            outcome.notice
        ]
        assert bench.stored(session.run.id).state is RunState.SUSPENDED
        assert ran == ["look:x"]


async def test_a_spent_budget_returns_halted_before_the_next_model_call(sqlite_url: str) -> None:
    model = Counting([{"tool_calls": [call("look", query="x")]}, {"content": "never asked"}])
    with Bench(sqlite_url, *TOOLS, model=model) as bench:
        session = await bench.session(limits={"max_steps": 1})

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.HALTED and outcome.reason == "max_steps"
        run = bench.stored(session.run.id)
        assert run.state is RunState.HALTED and run.halt_reason == "max_steps"
        assert model.asked == 1 and run.budget.steps == 1 and ran == ["look:x"]


async def test_a_read_that_raises_is_a_tool_error_for_the_model_and_the_run_goes_on(
    sqlite_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("put", item="a")]},
        {"tool_calls": [call("broken", query="x")]},
        {"content": "coped"},
    ]
    with Bench(sqlite_url, *TOOLS, turns=turns) as bench:
        session = await bench.session()

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.ANSWERED and outcome.answer == "coped"
        run = bench.stored(session.run.id)
        answers = _answers(bench.messages(run.id))
        assert answers[0] == {"item": "a"}
        assert answers[1]["error"] == "tool_error"
        assert "RuntimeError: a bug in the tool" in answers[1]["message"]
        assert run.budget.tool_calls == 2  # the read ran: it is counted
        assert bench.events(run.id, "failed") == []


async def test_a_guard_that_raises_fails_closed_the_write_never_runs(sqlite_url: str) -> None:
    with Bench(sqlite_url, *TOOLS, turns=[{"tool_calls": [call("guarded", item="a")]}]) as bench:
        session = await bench.session()

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.FAILED and ran == []
        assert bench.stored(session.run.id).state is RunState.FAILED


@pytest.mark.parametrize(
    ("transient", "kind"), [(True, StopKind.RELEASED), (False, StopKind.FAILED)]
)
async def test_a_model_that_fails_hands_the_run_back_or_fails_it(
    sqlite_url: str, transient: bool, kind: StopKind
) -> None:
    with Bench(sqlite_url, *TOOLS, model=Failing(transient=transient)) as bench:
        session = await bench.session()

        outcome = await loop.drive(session)

        assert outcome.kind is kind
        run = bench.stored(session.run.id)
        assert run.owner is None and run.budget.steps == 0  # nothing of the call stored
        if transient:
            assert outcome.reason == "model_retry" and (outcome.retry_in_s or 0) > 0
            assert run.state is RunState.RUNNING and run.model_failures == 1
        else:
            assert run.state is RunState.FAILED and run.fail_reason == "model_error"


async def test_a_stopping_worker_hands_the_run_back_at_the_next_step_boundary(
    sqlite_url: str,
) -> None:
    model = Counting([{"tool_calls": [call("look", query="x")]}, {"content": "done"}])
    with Bench(sqlite_url, *TOOLS, model=model) as bench:
        stopping = asyncio.Event()
        stopping.set()
        session = await RunSession.start(bench.services, await bench.claimed(), stopping=stopping)

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.RELEASED and outcome.reason == "worker stopping"
        run = bench.stored(session.run.id)
        assert run.state is RunState.RUNNING and run.owner is None and model.asked == 0


async def test_a_run_taken_over_returns_lease_lost_and_writes_nothing(sqlite_url: str) -> None:
    with Bench(sqlite_url, *TOOLS, turns=[{"tool_calls": [call("put", item="a")]}]) as bench:
        session = await bench.session()
        rival = bench.take_over(session)
        stored = bench.messages(session.run.id)

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.LEASE_LOST
        after = bench.stored(session.run.id)
        assert (after.owner, after.lease_epoch, after.budget) == (
            rival.owner,
            rival.lease_epoch,
            rival.budget,
        )
        assert bench.messages(session.run.id) == stored and ran == []


async def test_once_the_heartbeat_finds_the_run_taken_the_model_is_not_asked(
    sqlite_url: str,
) -> None:
    model = Counting([{"content": "never asked"}])
    with Bench(sqlite_url, *TOOLS, model=model, heartbeat_timeout_s=0.3) as bench:
        session = await bench.session()
        bench.take_over(session)
        heartbeat = bench.services.heartbeat
        await until(lambda: heartbeat.holding == 0, timeout=10, what="the beat to notice")

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.LEASE_LOST and model.asked == 0


async def test_a_database_that_went_away_abandons_the_run_and_never_fails_it(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Bench(sqlite_url, *TOOLS, turns=[{"content": "done"}]) as bench:
        session = await bench.session()

        def gone(*args: Any, **kwargs: Any) -> None:
            raise DatabaseUnavailable("the database is unavailable")

        monkeypatch.setattr(bench.store, "persist_turn", gone)
        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.ABANDONED
        run = bench.stored(session.run.id)
        assert run.state is RunState.RUNNING and run.owner == session.lease.owner  # for a reaper
        assert bench.events(run.id, "failed") == []
        assert bench.services.heartbeat.holding == 0  # nobody keeps its lease alive


async def test_a_read_only_step_is_one_write(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("look", query="a"), call("look", query="b")]},
        {"content": "done"},
    ]
    with Bench(sqlite_url, *TOOLS, turns=turns) as bench:
        writes: list[str] = []
        for name in ("persist_turn", "persist_tool_result"):
            method = getattr(bench.store, name)

            def counted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
                writes.append(_name)
                return _method(*args, **kw)

            monkeypatch.setattr(bench.store, name, counted)
        session = await bench.session()

        outcome = await loop.drive(session)

        assert outcome.kind is StopKind.ANSWERED
        assert writes == ["persist_turn", "persist_turn"]  # the reads' step, then the answer
        assert sorted(ran) == ["look:a", "look:b"]


# -- carry, batches, process -------------------------------------------------------------


async def test_carry_hands_back_a_run_whose_scope_cannot_be_resolved_with_a_delay(
    sqlite_url: str,
) -> None:
    resolvable = {"now": True}

    async def resolve(user_id: str) -> Scope:
        if not resolvable["now"]:
            raise ConnectionError("the directory is down")
        return Scope(user_id=user_id)

    with Bench(sqlite_url, *TOOLS, resolve=resolve, start_retry_s=30.0) as bench:
        run = await bench.claimed()
        resolvable["now"] = False

        outcome = await loop.carry(bench.services, run)

        assert outcome.kind is StopKind.RELEASED and outcome.reason == "start_failed"
        assert outcome.retry_in_s == 30.0
        stored = bench.stored(run.id)
        assert stored.state is RunState.RUNNING and stored.owner is None
        assert bench.store.claim_ready("another", run.id) is None  # not before its delay
        (failed,) = bench.events(run.id, "start_failed")
        assert "the directory is down" in failed.data["error"]


async def test_carry_of_a_claim_that_was_lost_meanwhile_is_lease_lost(sqlite_url: str) -> None:
    with Bench(sqlite_url, *TOOLS) as bench:
        run = await bench.claimed()
        bench.store.release(run.lease(), elapsed_ms=0)
        bench.store.claim_ready("rival", run.id)

        outcome = await loop.carry(bench.services, run)

        assert outcome.kind is StopKind.LEASE_LOST
        assert bench.stored(run.id).owner == "rival"


def _calls(*names: str) -> list[ToolCall]:
    return [
        ToolCall(id=f"c{i}", name=name, arguments=json.dumps({"query": "q"}))
        for i, name in enumerate(names)
    ]


@tool(effect="write", dedupes=True, concurrent=True)
def tally(ctx: ToolContext, query: str) -> dict[str, str]:
    """A write whose effects commute with the others'."""
    return {"counted": query}


async def test_consecutive_plain_reads_and_concurrent_writes_are_batched(sqlite_url: str) -> None:
    with Bench(sqlite_url, *TOOLS, tally) as bench:
        session = await bench.session()
        pending = _calls(
            "look", "tally", "look", "put", "tally", "tally", "peek", "nothing_like_it", "look",
            "send", "tally",
        )  # fmt: skip

        groups = loop.batches(session, pending)

        assert [[c.name for c in g] for g in groups] == [
            ["look", "tally", "look"],  # a concurrent write joins the reads beside it
            ["put"],  # a plain write runs alone: it splits the group
            ["tally", "tally"],
            ["peek"],  # a read a human may confirm is never run beside another
            ["nothing_like_it", "look"],  # an unknown tool is refused without running
            ["send"],
            ["tally"],
        ]
        session.close()


async def test_process_carries_out_a_decision_once(sqlite_url: str) -> None:
    turns = [{"tool_calls": [call("send", item="b")]}]
    with Bench(sqlite_url, *TOOLS, turns=turns) as bench:
        claimed = await bench.claimed()
        opened = await RunSession.start(bench.services, claimed)
        (pending,) = await bench.turn(opened)
        decision = Decision(
            run_id=claimed.id,
            tool_call_id=pending.id,
            decision="decline",
            by="boss",
            at=0.0,
            digest=None,
            reason="not this quarter",
        )
        session = RunSession(
            bench.services,
            claimed,
            list(opened.messages),
            opened.scope,
            decisions={pending.id: decision},
        )

        assert await loop.process(session, pending) is None

        (result,) = _answers(bench.messages(claimed.id))
        assert result["error"] == "declined_by_user" and result["reason"] == "not this quarter"
        assert session.take_decision(pending.id) is None and ran == []
        opened.close()
        session.close()
