"""A tool declaration that cannot work as written is refused when it is declared
(``invalid_tool``), naming the tool and the fix, never at a run's first call."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from tether import GuardResult, Reconciled, Scope, ToolContext, tool
from tether.errors import ConfigError
from tether.tools.declaration import InvalidTool


def _absent(key: str, ctx: ToolContext) -> Reconciled:
    return Reconciled.absent()


def test_a_first_parameter_without_the_context_annotation_is_refused_with_the_fix() -> None:
    def look(ctx, query: str) -> str:  # type: ignore[no-untyped-def]
        return query

    with pytest.raises(InvalidTool) as refused:
        tool(look)
    assert refused.value.code == "invalid_tool" and isinstance(refused.value, ConfigError)
    assert "tool look" in refused.value.message
    assert "annotate the first parameter `ctx: ToolContext`" in refused.value.message


def test_an_argument_without_an_annotation_is_refused() -> None:
    def find(ctx: ToolContext, query) -> str:  # type: ignore[no-untyped-def]
        return str(query)

    with pytest.raises(InvalidTool, match=r"tool find: parameter 'query' has no annotation"):
        tool(find)


def test_the_context_anywhere_but_first_is_refused() -> None:
    def late(query: str, ctx: ToolContext) -> str:
        return query

    with pytest.raises(InvalidTool, match=r"`ctx: ToolContext` must be its first parameter"):
        tool(late)


def test_an_annotated_context_is_not_shown_to_the_model() -> None:
    @tool
    def look(ctx: ToolContext, query: str) -> str:
        """Looks."""
        return query

    assert look.takes_context and look.spec().parameters["required"] == ["query"]


def test_an_unknown_effect_is_refused_naming_the_two_there_are() -> None:
    def write_it(item: str) -> str:
        return item

    with pytest.raises(InvalidTool) as refused:
        tool(effect="wrte", dedupes=True)(write_it)
    assert refused.value.message == "tool write_it: effect must be 'read' or 'write', got 'wrte'"


def _item(item: str) -> str:
    return item


def _one(a: Any) -> Any:
    return a


@pytest.mark.parametrize(
    ("role", "declared", "shape"),
    [
        ("reconcile", {"effect": "write", "reconcile": _one}, "(key, ctx)"),
        ("guard", {"guard": lambda args, scope: GuardResult.allow()}, "(arguments, scope, ctx)"),
        ("permitted", {"permitted": _one}, "(arguments, scope)"),
        ("preview", {"needs_confirmation": True, "preview": _one}, "(arguments, scope)"),
        ("needs_confirmation", {"needs_confirmation": _one}, "(arguments, scope)"),
    ],
)
def test_a_check_function_of_the_wrong_shape_is_refused_with_the_one_it_needs(
    role: str, declared: dict[str, Any], shape: str
) -> None:
    with pytest.raises(InvalidTool) as refused:
        tool(**declared)(_item)
    message = refused.value.message
    assert message.startswith(f"tool _item: {role} must take {shape}")
    assert f"def {role}{shape}" in message


def test_check_functions_that_fit_are_accepted_whatever_they_are() -> None:
    class Downstream:
        def find(self, key: str, ctx: ToolContext) -> Reconciled:
            return Reconciled.absent()

    def permitted(crm: object, args: Any, scope: Scope) -> bool:
        return True

    def flexible(*args: Any) -> bool:
        return False

    def guard(args: Any, scope: Scope, ctx: ToolContext, extra: int = 1) -> GuardResult:
        return GuardResult.allow()

    declared = tool(
        effect="write",
        reconcile=Downstream().find,
        permitted=partial(permitted, object()),
        needs_confirmation=flexible,
        guard=guard,
    )(_item)
    assert declared.reconcile is not None and tool(effect="write", reconcile=_absent)(_item)
