"""Sub-agents (reference §18), through the Engine, on both backends: a parent's sub-agent
calls start one child run each and the parent waits; the children's results reach the
parent once, in call order, in the shapes the reference gives; a child's call is decided
through its root; one budget binds a tree (``consumed_tree``, ``halted_by``, the grant that
resumes a subtree), also when children race; cancelling cascades; dry runs and depth.

Children are carried here with ``run_until_stop`` (a worker would claim them the same
way), so every interleaving a test needs is made explicit, never left to timing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import inprocess
import pytest
from pydantic import BaseModel

from tether import Agent, Engine, ScriptedModel, StopKind, tool
from tether.errors import ConfigError, HaltedByAncestor, InvalidInput, NotHalted
from tether.runs import Run, RunState
from tether.tools.declaration import InvalidTool

RESEARCH = "You research."
SEND = "You send."


@tool
def look(q: str) -> dict[str, str]:
    """Look something up."""
    return {"found": q}


SENT: list[str] = []


@tool(effect="write", needs_confirmation=True, dedupes=True)
def send(what: str) -> dict[str, str]:
    """Send something (needs a person's confirmation)."""
    SENT.append(what)
    return {"sent": what}


class Finding(BaseModel):
    fact: str


def researcher(**kw: Any) -> Agent:
    kw.setdefault("tools", (look,))
    return Agent(name="researcher", system_prompt=RESEARCH, **kw)


def sender() -> Agent:
    return Agent(name="sender", system_prompt=SEND, tools=(send,))


def delegate(*tasks: tuple[str, str], extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One parent turn calling sub-agent tools: (tool name, task) each, then ``extra``."""
    calls = [{"name": name, "arguments": {"task": task}} for name, task in tasks]
    return {"tool_calls": [*calls, *(extra or [])]}


def engine(url: str, parent: Agent, turns: list[dict[str, Any]], **by: Any) -> Engine:
    model = ScriptedModel(turns, by_system=by.pop("by_system", {}))
    return inprocess.engine_for(url, parent, model, **by)


def researching(turns: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {RESEARCH: {"turns": turns or [{"content": "research answer"}]}}


async def children(engine: Engine, run_id: str) -> list[Run]:
    return engine.runner.store.children(run_id)


async def carry_children(engine: Engine, run_id: str) -> list[StopKind]:
    """Carry each child of ``run_id`` to its stop, in call order."""
    return [(await engine.run_until_stop(c.id)).kind for c in await children(engine, run_id)]


def tool_results(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [
        (str(m["tool_call_id"]), json.loads(m["content"]))
        for m in messages
        if m.get("role") == "tool"
    ]


async def test_a_delegation_waits_for_its_children_and_gets_their_answers_in_call_order(
    db_url: str,
) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(), look))
    turns = [
        delegate(("researcher", "find A"), ("researcher", "find B"), extra=[call("look", q="x")]),
        {"content": "planned"},
    ]
    eng = engine(db_url, parent, turns, by_system=researching())
    async with eng:
        first = await eng.ask("dana", "plan")
        assert first.kind is StopKind.WAITING
        view = await eng.get_run(first.run_id)
        assert view.run.state is RunState.WAITING and view.run.owner is None
        kids = await children(eng, first.run_id)
        assert [c.question for c in kids] == ["find A", "find B"]
        assert all(c.parent_run_id == first.run_id and c.depth == 1 for c in kids)
        assert all(c.root_run_id == first.run_id and c.user_id == "dana" for c in kids)
        assert [c.parent_tool_call_id for c in kids] == ["call_0_0", "call_0_1"]
        assert kids[0].agent_version == researcher().agent_version
        # The read of the turn ran while the children were started; the parent waits.
        assert [cid for cid, _ in tool_results(view.messages)] == ["call_0_2"]
        assert await carry_children(eng, first.run_id) == [StopKind.ANSWERED] * 2
        assert (await eng.get_run(first.run_id)).run.state is RunState.RUNNING  # woken
        last = await eng.run_until_stop(first.run_id)
        assert last.kind is StopKind.ANSWERED and last.answer == "planned"
        done = await eng.get_run(first.run_id)
        results = dict(tool_results(done.messages))
        assert results["call_0_0"] == {"answer": "research answer"}
        assert results["call_0_1"] == {"answer": "research answer"}
        kinds = [e.kind for e in await eng.events(first.run_id)]
        assert kinds.count("child_started") == 2 and kinds.count("child_stopped") == 2
        assert done.run.budget.tool_calls == 3  # each sub-agent call is one of its calls
        tree = await eng.get_tree(kids[1].id, user="dana")
        assert [r.id for r in tree.runs] == [first.run_id, kids[0].id, kids[1].id]
        assert tree.consumed_tree.steps == 2 + 2 * 1


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def test_a_childs_tool_call_ids_are_unique_across_its_tree(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    child_turns: list[dict[str, Any]] = [
        {"tool_calls": [{"id": "call_0_0", **call("look", q="r")}]},
        {"content": "a"},
    ]
    eng = engine(
        db_url, parent, [delegate(("researcher", "t"))], by_system=researching(child_turns)
    )
    async with eng:
        first = await eng.ask("dana", "plan")
        (kid,) = await children(eng, first.run_id)
        await eng.run_until_stop(kid.id)
        ids = [cid for cid, _ in tool_results((await eng.get_run(kid.id)).messages)]
        assert ids == [f"call_0_0-{kid.id}"]


async def test_failed_cancelled_and_typed_children_give_their_shapes(db_url: str) -> None:
    typed = researcher(output_type=Finding)
    parent = Agent(name="planner", system_prompt="You plan.", tools=(typed.as_tool(),))
    turns = [delegate(("researcher", "a"), ("researcher", "b"))]
    child = [{"content": json.dumps({"fact": "sky is blue"})}]
    eng = engine(db_url, parent, turns, by_system=researching(child))
    async with eng:
        first = await eng.ask("dana", "plan")
        one, two = await children(eng, first.run_id)
        assert (await eng.run_until_stop(one.id)).kind is StopKind.ANSWERED
        await eng.cancel_run(two.id, "dana")
        await eng.run_until_stop(first.run_id)
        results = dict(tool_results((await eng.get_run(first.run_id)).messages))
        assert results["call_0_0"] == {"output": {"fact": "sky is blue"}}
        assert results["call_0_1"]["error"] == "cancelled"


async def test_a_sub_agent_call_in_a_run_at_the_deepest_depth_starts_nothing(
    db_url: str,
) -> None:
    leaf = Agent(name="leaf", system_prompt="You leaf.", tools=())
    middle = Agent(name="middle", system_prompt=RESEARCH, tools=(leaf.as_tool(),))
    parent = Agent(name="planner", system_prompt="You plan.", tools=(middle.as_tool(),))
    by = researching([delegate(("leaf", "deeper")), {"content": "middle done"}])
    eng = engine(db_url, parent, [delegate(("middle", "go"))], by_system=by, max_depth=1)
    async with eng:
        first = await eng.ask("dana", "plan")
        (mid,) = await children(eng, first.run_id)
        assert (await eng.run_until_stop(mid.id)).kind is StopKind.ANSWERED
        assert await children(eng, mid.id) == []
        (result,) = tool_results((await eng.get_run(mid.id)).messages)
        assert result[1]["error"] == "depth_exceeded"


async def test_a_dry_run_starts_no_child(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    turns = [
        {"tool_calls": [call("look", q="x")]},
        delegate(("researcher", "a")),
        {"content": "ok"},
    ]
    eng = engine(db_url, parent, turns, by_system=researching())
    async with eng:
        first = await eng.ask("dana", "plan")
        await carry_children(eng, first.run_id)
        await eng.run_until_stop(first.run_id)
        fork = await eng.fork_run(first.run_id, "dana", at_step=1, dry_run=True)
        await eng.continue_run(fork.id, "dana")
        assert (await eng.run_until_stop(fork.id)).kind is StopKind.ANSWERED
        assert await children(eng, fork.id) == []
        results = tool_results((await eng.get_run(fork.id)).messages)
        assert results[-1][1]["dry_run"] is True


async def test_a_childs_call_is_decided_through_its_root(db_url: str) -> None:
    SENT.clear()
    parent = Agent(name="planner", system_prompt="You plan.", tools=(sender().as_tool(),))
    by = {SEND: {"turns": [{"tool_calls": [call("send", what="quote")]}, {"content": "sent"}]}}
    eng = engine(
        db_url, parent, [delegate(("sender", "send it")), {"content": "done"}], by_system=by
    )
    async with eng:
        first = await eng.ask("dana", "plan")
        (kid,) = await children(eng, first.run_id)
        assert (await eng.run_until_stop(kid.id)).kind is StopKind.SUSPENDED
        pending = (await eng.get_run(kid.id)).run
        (request,) = (await eng.pending_approvals("dana")).runs
        assert request.id == kid.id and request.root_run_id == first.run_id
        call_id = pending.undecided_calls()[0].tool_call_id
        with pytest.raises(InvalidInput):
            await eng.decide_calls(
                first.run_id, "dana", [{"tool_call_id": "nope", "decision": "approve"}]
            )
        (decided,) = await eng.decide_calls(
            first.run_id, "dana", [{"tool_call_id": call_id, "decision": "approve"}]
        )
        assert decided.result is not None and decided.result.outcome.value == "executed"
        assert SENT == ["quote"]
        assert (await eng.run_until_stop(kid.id)).kind is StopKind.ANSWERED
        assert (await eng.run_until_stop(first.run_id)).answer == "done"


async def test_an_ancestors_limits_halt_the_child_and_its_continuation_resumes_it(
    db_url: str,
) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    looping = [{"tool_calls": [call("look", q=str(i))]} for i in range(10)]
    turns = [delegate(("researcher", "dig")), {"content": "planned"}]
    eng = engine(db_url, parent, turns, by_system=researching(looping))
    async with eng:
        first = await eng.ask("dana", "plan", limits={"max_steps": 3})
        (kid,) = await children(eng, first.run_id)
        halted = await eng.run_until_stop(kid.id)
        assert halted.kind is StopKind.HALTED and halted.reason == "max_steps"
        kid_now = (await eng.get_run(kid.id)).run
        assert kid_now.halted_by == first.run_id
        tree = await eng.get_tree(first.run_id, user="dana")
        assert tree.consumed_tree.steps == 3  # never past the root's limit
        child_halted = [e for e in await eng.events(first.run_id) if e.kind == "child_halted"]
        assert child_halted and child_halted[0].data["halted_by"] == first.run_id
        with pytest.raises(HaltedByAncestor) as refused:
            await eng.continue_run(kid.id, "dana")
        assert refused.value.details["run_id"] == first.run_id
        grant = await eng.continue_run(first.run_id, "dana", limits={"max_steps": 40})
        assert grant.state is RunState.WAITING and grant.limits.max_steps == 40
        resumed = (await eng.get_run(kid.id)).run
        assert resumed.state is RunState.RUNNING and resumed.halted_by is None
        (continued,) = [e for e in await eng.events(first.run_id) if e.kind == "continued"]
        assert continued.data["resumed"] == [kid.id]
        assert not [e for e in await eng.events(kid.id) if e.kind == "continued"]
        with pytest.raises(NotHalted):
            await eng.continue_run(first.run_id, "dana")
        assert (await eng.run_until_stop(kid.id)).kind is StopKind.ANSWERED
        assert (await eng.run_until_stop(first.run_id)).answer == "planned"


async def test_racing_children_never_take_their_tree_past_the_roots_steps(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    looping = [{"tool_calls": [call("look", q=str(i))]} for i in range(20)]
    turns = [delegate(*[("researcher", f"dig {i}") for i in range(6)])]
    eng = engine(db_url, parent, turns, by_system=researching(looping))
    async with eng:
        first = await eng.ask("dana", "plan", limits={"max_steps": 9})
        kids = await children(eng, first.run_id)
        stops = await asyncio.gather(*(eng.run_until_stop(k.id) for k in kids))
        assert {s.kind for s in stops} == {StopKind.HALTED}
        tree = await eng.get_tree(first.run_id, user="dana")
        assert tree.consumed_tree.steps == 9  # exactly: the last step of each is refused
        assert {r.halted_by for r in tree.runs[1:]} == {first.run_id}


NOTES: list[str] = []


@tool(effect="write", dedupes=True)
def note(text: str) -> dict[str, str]:
    """Write a note (a write the downstream deduplicates by key)."""
    NOTES.append(text)
    return {"noted": text}


@pytest.mark.parametrize("kind", ["write", "read"])
async def test_racing_children_never_take_their_tree_past_the_roots_tool_calls(
    db_url: str, kind: str
) -> None:
    NOTES.clear()
    sub = researcher(tools=(look, note))
    parent = Agent(name="planner", system_prompt="You plan.", tools=(sub.as_tool(),))
    name, args = ("note", {"text": "n"}) if kind == "write" else ("look", {"q": "q"})
    looping = [{"tool_calls": [call(name, **args)]} for _ in range(20)]
    turns = [delegate(*[("researcher", f"dig {i}") for i in range(4)])]
    eng = engine(db_url, parent, turns, by_system=researching(looping))
    async with eng:
        # The 4 sub-agent calls are 4 of the root's tool calls; 5 are left for the tree.
        first = await eng.ask("dana", "plan", limits={"max_tool_calls": 9})
        kids = await children(eng, first.run_id)
        stops = await asyncio.gather(*(eng.run_until_stop(k.id) for k in kids))
        assert {(s.kind, s.reason) for s in stops} == {(StopKind.HALTED, "max_tool_calls")}
        tree = await eng.get_tree(first.run_id, user="dana")
        assert tree.consumed_tree.tool_calls == 9
        if kind == "write":
            assert len(NOTES) == 5  # every call that ran is counted, and no more ran


async def test_cancelling_a_root_cancels_its_tree_in_one_go(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    eng = engine(db_url, parent, [delegate(("researcher", "a"), ("researcher", "b"))])
    async with eng:
        first = await eng.ask("dana", "plan")
        cancelled = await eng.cancel_run(first.run_id, "dana")
        assert cancelled.state is RunState.CANCELLED
        assert {c.state for c in await children(eng, first.run_id)} == {RunState.CANCELLED}


async def test_a_sub_agent_is_declared_with_checked_arguments(db_url: str) -> None:
    sub = researcher()
    with pytest.raises(InvalidTool):
        sub.as_tool(name="two words")
    with pytest.raises(InvalidTool):
        sub.as_tool(limits={"max_steps": 0})
    with pytest.raises(InvalidTool):
        sub.as_tool(limits={"max_turns": 3})
    with pytest.raises(InvalidTool):
        sub.as_tool(description="")
    over = Agent(name="p", system_prompt="p", tools=(sub.as_tool(limits={"max_steps": 5000}),))
    with pytest.raises(ConfigError, match="max_steps"):
        inprocess.engine_for(db_url, over, [])
    parent = Agent(name="p", system_prompt="p", tools=(sub.as_tool(name="helper"),))
    assert parent.tool("helper") is not None
    assert researcher(tools=()).agent_version != researcher().agent_version
    changed = Agent(name="p", system_prompt="p", tools=(researcher(tools=()).as_tool(),))
    assert (
        changed.agent_version
        != Agent(name="p", system_prompt="p", tools=(sub.as_tool(),)).agent_version
    )


async def test_a_task_that_is_not_a_string_starts_nothing(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    turns: list[dict[str, Any]] = [
        {"tool_calls": [call("researcher", task=7)]},
        {"content": "gave up"},
    ]
    eng = engine(db_url, parent, turns)
    async with eng:
        outcome = await eng.ask("dana", "plan")
        assert outcome.kind is StopKind.ANSWERED
        assert await children(eng, outcome.run_id) == []
        (result,) = tool_results((await eng.get_run(outcome.run_id)).messages)
        assert "task" in result[1]["message"]


async def test_a_fork_of_a_child_is_a_top_level_run_of_the_sub_agent(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    child: list[dict[str, Any]] = [{"tool_calls": [call("look", q="r")]}, {"content": "found"}]
    eng = engine(db_url, parent, [delegate(("researcher", "dig"))], by_system=researching(child))
    async with eng:
        first = await eng.ask("dana", "plan")
        (kid,) = await children(eng, first.run_id)
        await eng.run_until_stop(kid.id)
        fork = await eng.fork_run(kid.id, "dana", at_step=1)
        assert fork.parent_run_id is None and fork.depth == 0 and fork.root_run_id == fork.id
        assert fork.agent_version == researcher().agent_version
        await eng.continue_run(fork.id, "dana")
        assert (await eng.run_until_stop(fork.id)).answer == "found"
        assert [r.id for r in (await eng.get_tree(fork.id, user="dana")).runs] == [fork.id]


async def test_a_tree_is_purged_and_deleted_with_its_root_never_a_child_alone(
    db_url: str,
) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(researcher().as_tool(),))
    turns = [delegate(("researcher", "a"), ("researcher", "b")), {"content": "planned"}]
    eng = engine(db_url, parent, turns, by_system=researching())
    async with eng:
        store = eng.runner.store
        first = await eng.ask("dana", "plan")
        one, two = await children(eng, first.run_id)
        await eng.run_until_stop(one.id)
        assert store.purge_retained(0.0, 100) == 0  # the root waits: its tree is kept whole
        assert store.get_run(one.id) is not None
        await eng.run_until_stop(two.id)
        await eng.run_until_stop(first.run_id)
        threads = await eng.list_threads("dana")
        assert [t.id for t in threads] == [first.run_id]  # a child's thread is not listed
        await eng.delete_thread(first.run_id, user="dana")
        assert store.get_run(first.run_id) is None
        assert store.get_run(one.id) is None and store.get_run(two.id) is None
        second = await eng.ask("dana", "again")
        await carry_children(eng, second.run_id)
        await eng.run_until_stop(second.run_id)
        assert store.purge_retained(0.0, 100) == 3  # the root and its two children, as one


async def test_the_tree_lists_every_pending_call_of_a_childs_suspension(db_url: str) -> None:
    parent = Agent(name="planner", system_prompt="You plan.", tools=(sender().as_tool(),))
    two = {"tool_calls": [call("send", what="one"), call("send", what="two")]}
    eng = engine(
        db_url, parent, [delegate(("sender", "send both"))], by_system={SEND: {"turns": [two]}}
    )
    async with eng:
        first = await eng.ask("dana", "plan")
        (kid,) = await children(eng, first.run_id)
        assert (await eng.run_until_stop(kid.id)).kind is StopKind.SUSPENDED
        body = (await eng.get_tree(first.run_id, user="dana")).to_json()
        pending = [r["pending_calls"] for r in body["runs"]]
        assert [len(p) for p in pending] == [0, 2]
        assert [p["arguments"] for p in pending[1]] == [{"what": "one"}, {"what": "two"}]
