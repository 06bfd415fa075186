"""Who decides, as declared (reference §19): a tool's quorum and escalation are checked when
the tool is declared, and an escalation again against the window of the engine that serves
it, each refusal ``invalid_tool`` naming the tool; a quorum function that cannot say how
many people approve a call refuses the call (fails closed); a scope names people and
groups, and who belongs to a group is the approver's own scope's answer."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, Engine, Scope, ScriptedModel, Settings, Tool, ToolFailed, tool
from tether.scope import names
from tether.tools import deciders
from tether.tools.declaration import InvalidTool

WINDOW = deciders.environment_window_min()  # the window a declaration is checked against
OWNER = Scope(user_id="dana", approvers=frozenset({"boss", "group:finance"}))


def _pay(to: str, amount: int) -> str:
    return f"{to}:{amount}"


def declared(**options: Any) -> Tool:
    """``pay`` declared as a confirmed write with ``options``."""
    base: dict[str, Any] = {"effect": "write", "dedupes": True, "needs_confirmation": True}
    return tool(name="pay", **{**base, **options})(_pay)


def refused(**options: Any) -> InvalidTool:
    with pytest.raises(InvalidTool) as caught:
        declared(**options)
    assert caught.value.code == "invalid_tool"
    assert "tool pay" in caught.value.message  # names the tool
    return caught.value


# -- quorum -----------------------------------------------------------------------------------


@pytest.mark.parametrize("quorum", [0, -1, True, False, 1.5, 2.0, 101, "2", None])
def test_a_quorum_that_is_not_a_whole_number_from_1_to_100_is_refused(quorum: object) -> None:
    assert "quorum must be a whole number from 1 to 100" in refused(quorum=quorum).message


@pytest.mark.parametrize("quorum", [1, 2, 100])
def test_a_quorum_from_1_to_100_is_kept(quorum: int) -> None:
    assert declared(quorum=quorum).quorum == quorum


def _one(args: Any) -> int:
    return 2


def _three(args: Any, scope: Any, ctx: Any) -> int:
    return 2


@pytest.mark.parametrize("rule", [_one, _three, lambda: 2])
def test_a_quorum_function_that_cannot_take_arguments_and_scope_is_refused(
    rule: Callable[..., Any],
) -> None:
    assert "quorum must take (arguments, scope)" in refused(quorum=rule).message


@pytest.mark.parametrize("quorum", [2, lambda args, scope: 2])
def test_a_quorum_on_a_tool_that_needs_no_confirmation_is_refused(quorum: object) -> None:
    message = refused(quorum=quorum, needs_confirmation=False).message
    assert "Declare needs_confirmation, or drop quorum" in message


def test_a_quorum_goes_with_a_conditional_confirmation() -> None:
    made = declared(
        needs_confirmation=lambda args, scope: args.amount > 100, quorum=lambda args, scope: 2
    )
    assert callable(made.quorum)


def test_without_a_quorum_one_person_decides() -> None:
    assert declared().quorum == 1 and tool(_pay).quorum == 1


# -- a quorum function, when a call is suspended ----------------------------------------------


async def quorum_of(rule: Callable[[Any, Scope], Any], amount: int = 500) -> int:
    made = declared(quorum=rule)
    return await made.quorum_for(made.validate({"to": "acct-1", "amount": amount}), OWNER)


async def test_a_quorum_function_answers_how_many_people_approve_this_call() -> None:
    def by_amount(args: Any, scope: Scope) -> int:
        return 3 if args.amount > 10_000 else 2

    assert await quorum_of(by_amount, amount=20_000) == 3
    assert await quorum_of(by_amount, amount=500) == 2


async def test_an_async_quorum_function_is_awaited() -> None:
    async def three(args: Any, scope: Scope) -> int:
        return 3

    assert await quorum_of(three) == 3


async def test_a_constant_quorum_needs_no_function() -> None:
    made = declared(quorum=2)
    assert await made.quorum_for(made.validate({"to": "a", "amount": 1}), OWNER) == 2


def _raises(args: Any, scope: Scope) -> int:
    raise RuntimeError("the directory is down")


@pytest.mark.parametrize(
    "rule",
    [
        lambda args, scope: 0,
        lambda args, scope: 101,
        lambda args, scope: True,
        lambda args, scope: "2",
        lambda args, scope: None,
        lambda args, scope: 2.0,
        _raises,
    ],
)
async def test_a_quorum_function_that_cannot_say_refuses_the_call(
    rule: Callable[[Any, Scope], Any],
) -> None:
    with pytest.raises(ToolFailed) as caught:
        await quorum_of(rule)
    assert caught.value.code == "tool_error" and "pay" in caught.value.message


# -- escalation -------------------------------------------------------------------------------


def test_an_escalation_is_kept_with_escalate_to_as_a_tuple() -> None:
    made = declared(escalate_after_min=WINDOW / 2, escalate_to="lead")
    assert made.escalate_after_min == WINDOW / 2 and made.escalate_to == ("lead",)


def test_escalate_to_keeps_each_name_once_in_order() -> None:
    to = ["group:oncall", "lead", "lead", "group:oncall"]
    made = declared(escalate_after_min=0.5, escalate_to=to)
    assert made.escalate_to == ("group:oncall", "lead")


def test_an_escalation_may_come_within_a_fraction_of_a_minute() -> None:
    assert declared(escalate_after_min=0.005, escalate_to=("lead",)).escalate_after_min == 0.005


@pytest.mark.parametrize("after", [0, -1, -0.5, math.nan, math.inf, WINDOW, WINDOW * 2])
def test_an_escalation_not_above_0_and_below_the_window_is_refused(after: float) -> None:
    message = refused(escalate_after_min=after, escalate_to=("lead",)).message
    assert "escalate_after_min must be > 0 and less than the suspension window" in message


@pytest.mark.parametrize("after", [True, "5", [5]])
def test_an_escalation_that_is_not_a_number_of_minutes_is_refused(after: object) -> None:
    message = refused(escalate_after_min=after, escalate_to=("lead",)).message
    assert "escalate_after_min must be a number of minutes" in message


@pytest.mark.parametrize(
    "to",
    [(), [], "", ("",), 42, ("bad name",), ("group:",), ("group:bad name",), ("lead", 7)],
)
def test_escalate_to_naming_nobody_or_an_invalid_name_is_refused(to: object) -> None:
    assert "escalate_to" in refused(escalate_after_min=1, escalate_to=to).message


def test_escalate_to_without_escalate_after_min_is_refused() -> None:
    message = refused(escalate_to=("lead",)).message
    assert "declare escalate_after_min too" in message


def test_an_escalation_of_a_tool_that_needs_no_confirmation_is_refused() -> None:
    message = refused(escalate_after_min=1, escalate_to=("lead",), needs_confirmation=False).message
    assert "Declare needs_confirmation, or drop the escalation" in message


def test_the_window_checked_is_the_one_given() -> None:
    assert deciders.check_escalation("pay", 10, "lead", confirms=True, window_min=15) == ("lead",)
    with pytest.raises(InvalidTool, match=r"less than the suspension window \(5 min"):
        deciders.check_escalation("pay", 10, "lead", confirms=True, window_min=5)


def _agent(*tools: Tool) -> Agent:
    return Agent(name="deciders", system_prompt="-", tools=tools)


def test_an_engine_whose_window_ends_before_an_escalation_refuses_the_tool(
    tmp_path: Path,
) -> None:
    """Declared against the environment's window, checked again against the engine's."""
    after = WINDOW / 2
    page = declared(escalate_after_min=after, escalate_to=("group:oncall",))
    with pytest.raises(InvalidTool) as caught:
        Engine(
            agent=_agent(page),
            model=ScriptedModel([]),
            settings=Settings(suspension_ttl_min=after / 2),
            database_url=f"sqlite:///{tmp_path / 'x.db'}",
        )
    assert caught.value.code == "invalid_tool" and "tool pay" in caught.value.message
    engine = Engine(
        agent=_agent(page),
        model=ScriptedModel([]),
        settings=Settings(suspension_ttl_min=after * 2),
        database_url=f"sqlite:///{tmp_path / 'y.db'}",
    )
    engine.close()  # a window past the escalation is accepted


def test_an_engine_checks_the_sub_agents_tools_too(tmp_path: Path) -> None:
    page = declared(escalate_after_min=WINDOW / 2, escalate_to=("lead",))
    lead = Agent(name="lead", system_prompt="-", tools=(_agent(page).as_tool(),))
    with pytest.raises(InvalidTool):
        Engine(
            agent=lead,
            model=ScriptedModel([]),
            settings=Settings(suspension_ttl_min=WINDOW / 4),
            database_url=f"sqlite:///{tmp_path / 'x.db'}",
        )


# -- scopes -----------------------------------------------------------------------------------


def test_an_approver_is_named_or_belongs_to_a_group_the_owners_scope_names() -> None:
    assert OWNER.may_approve("dana")  # the owner
    assert OWNER.may_approve("boss")  # named
    assert not OWNER.may_approve("ann")  # a group member, but nobody said so
    assert OWNER.may_approve("ann", {"finance"})  # by her own scope
    assert not OWNER.may_approve("ann", {"sales"})
    assert not OWNER.may_approve("finance")  # a user named like the group is not it
    assert OWNER.names_groups and not Scope(user_id="x", approvers=frozenset({"boss"})).names_groups


def test_a_scope_takes_any_iterable_of_names_and_keeps_frozensets() -> None:
    scope = Scope(user_id="ann", approvers=["boss"], groups=["finance", "finance"])  # type: ignore[arg-type]
    assert scope.approvers == frozenset({"boss"}) and scope.groups == frozenset({"finance"})


def test_a_scopes_json_names_its_groups_only_when_it_has_some() -> None:
    member = Scope(
        user_id="ann",
        permissions={"limit": 5},
        approvers=frozenset({"boss"}),
        groups=frozenset({"sales", "finance"}),
    )
    data = member.to_json()
    assert data["groups"] == ["finance", "sales"] and data["approvers"] == ["boss"]
    assert Scope.from_json(data) == member
    alone = Scope(user_id="dana", approvers=frozenset({"group:finance"}))
    assert "groups" not in alone.to_json()
    assert Scope.from_json(alone.to_json()) == alone
    assert Scope.from_json({"user_id": "old"}) == Scope(user_id="old")  # a snapshot before groups


def test_names_matches_a_person_or_one_of_their_groups() -> None:
    listed = ("lead", "group:oncall")
    assert names(listed, "lead", ())
    assert names(listed, "olga", {"oncall"})
    assert names(listed, "olga", ["sales", "oncall"])
    assert not names(listed, "olga", {"sales"})
    assert not names(listed, "oncall", ())  # the group's name is not a person
    assert not names((), "lead", {"oncall"})
