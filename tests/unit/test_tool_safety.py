"""Safe by default (STYLE rule 11): unsafe tool definitions are refused when declared, and
a guard answer that is not an explicit allow refuses the call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tether import (
    Agent,
    Engine,
    GuardResult,
    Reconciled,
    Scope,
    ScriptedModel,
    Settings,
    StopKind,
    ToolContext,
    tool,
)
from tether.tools.declaration import InvalidTool
from tether.tools.tool import UnsafeTool


def _noop() -> dict[str, str]:
    """Does nothing."""
    return {"ok": "yes"}


def test_a_write_with_neither_reconcile_nor_dedupes_is_refused_with_how_to_declare_it() -> None:
    with pytest.raises(UnsafeTool) as refused:
        tool(effect="write")(_noop)
    message = refused.value.message
    assert "reconcile=" in message and "dedupes=True" in message
    assert "accept_unreconcilable=True" in message


@pytest.mark.parametrize(
    "declaration",
    [
        {"dedupes": True},
        {"reconcile": lambda key, ctx: Reconciled.absent()},
        {"accept_unreconcilable": True},
    ],
)
def test_a_write_declared_safely_is_accepted(declaration: dict[str, Any]) -> None:
    assert tool(effect="write", **declaration)(_noop).effect.value == "write"


def test_concurrent_is_off_by_default_and_accepted_on_writes_and_reads_needing_no_one() -> None:
    assert tool(effect="write", dedupes=True)(_noop).concurrent is False
    assert tool(effect="write", dedupes=True, concurrent=True)(_noop).concurrent is True
    assert tool(concurrent=True)(_noop).concurrent is True  # a read: it changes nothing


@pytest.mark.parametrize(
    "confirmation", [True, lambda args, scope: False], ids=["always", "conditional"]
)
def test_concurrent_on_a_tool_that_may_need_confirmation_is_refused(confirmation: Any) -> None:
    with pytest.raises(InvalidTool) as refused:
        tool(effect="write", dedupes=True, needs_confirmation=confirmation, concurrent=True)(_noop)
    assert refused.value.code == "invalid_tool"
    assert "runs alone, after its decision" in refused.value.message
    with pytest.raises(InvalidTool):
        tool(needs_confirmation=True, concurrent=True)(_noop)  # a read a human confirms too
    with pytest.raises(InvalidTool, match="True or False"):
        tool(effect="write", dedupes=True, concurrent="yes")(_noop)  # type: ignore[call-overload]


def test_a_confirmation_that_is_not_a_bool_or_a_function_is_refused_when_declared() -> None:
    with pytest.raises(UnsafeTool):

        @tool(effect="write", dedupes=True, needs_confirmation="yes")  # type: ignore[call-overload, misc]
        def odd(ctx: ToolContext, amount: int) -> dict[str, Any]:
            return {}


def test_a_preview_on_a_tool_that_needs_no_confirmation_is_refused() -> None:
    with pytest.raises(UnsafeTool, match="needs_confirmation=True"):
        tool(preview=lambda args, scope: {"x": 1})(_noop)
    confirmed = tool(needs_confirmation=True, preview=lambda args, scope: {"x": 1})(_noop)
    assert confirmed.needs_confirmation


@pytest.mark.parametrize("answer", [False, None, True, "allow", 1, {"ok": True}])
async def test_a_guard_answer_that_is_not_an_explicit_allow_refuses(answer: object) -> None:
    guarded = tool(guard=lambda args, scope, ctx: answer)(_noop)
    ctx = ToolContext(
        run_id="r", user_id="u", tool_call_id="c", idempotency_key="r:c", scope=Scope(user_id="u")
    )
    verdict = await guarded.check_guard(guarded.validate({}), Scope(user_id="u"), ctx)
    assert not verdict.ok and verdict.reason and "GuardResult.allow()" in verdict.reason


async def test_an_explicit_allow_allows_and_a_refusal_without_reason_still_refuses() -> None:
    ctx = ToolContext(
        run_id="r", user_id="u", tool_call_id="c", idempotency_key="r:c", scope=Scope(user_id="u")
    )
    allowed = tool(guard=lambda args, scope, ctx: GuardResult.allow())(_noop)
    refused = tool(guard=lambda args, scope, ctx: GuardResult(ok=False))(_noop)
    assert (await allowed.check_guard(allowed.validate({}), ctx.scope, ctx)).ok
    assert not (await refused.check_guard(refused.validate({}), ctx.scope, ctx)).ok


async def test_a_guard_that_answers_none_keeps_the_tool_from_running(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool(guard=lambda args, scope, ctx: None)
    def lookup(query: str) -> dict[str, str]:
        """A read whose guard forgets to answer."""
        ran.append(query)
        return {"answer": query}

    model = ScriptedModel(
        [{"tool_calls": [{"name": "lookup", "arguments": {"query": "q"}}]}, {"content": "done"}]
    )
    agent = Agent(name="guarded", system_prompt="s", tools=(lookup,))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 't.db'}")
    async with Engine(agent=agent, model=model, settings=settings, migrate=True) as engine:
        outcome = await engine.ask("dana", "look")
        assert outcome.kind is StopKind.ANSWERED and outcome.answer == "done"
        view = await engine.get_run(outcome.run_id)
    assert ran == []
    results = [m for m in view.messages if m["role"] == "tool"]
    assert len(results) == 1 and '"error":"guard_failed"' in results[0]["content"]


def test_approvers_is_any_by_default_others_for_four_eyes_and_nothing_else() -> None:
    from tether import Approvers
    from tether.errors import ConfigError

    assert tool(_noop).approvers is Approvers.ANY
    four_eyes = tool(needs_confirmation=True, approvers="others")(_noop)
    assert four_eyes.approvers is Approvers.OTHERS
    assert not four_eyes.may_be_decided_by("dana", "dana")
    assert four_eyes.may_be_decided_by("boss", "dana")
    assert tool(needs_confirmation=True)(_noop).may_be_decided_by("dana", "dana")
    for wrong in ("nobody", "", True, None):
        with pytest.raises(ConfigError, match=r"approvers must be 'any'.*or 'others'"):
            tool(needs_confirmation=True, approvers=wrong)(_noop)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs none"):  # nothing to decide without it
        tool(approvers="others")(_noop)
