"""What a tool declaration must get right, checked when it is declared, not at its first call.

A function's parameters become the arguments the model is asked for, except a first one
annotated ``ToolContext``; a parameter with no annotation would reach the model as an
untyped argument (a forgotten ``ctx: ToolContext`` would be a required argument the model
must invent), so it is refused. The functions a tool declares beside it (``preview``,
``guard``, ``permitted``, ``reconcile``, a conditional ``needs_confirmation``) are called
with fixed arguments; one that cannot take them is refused here, with the shape it needs,
rather than failing a run later. Every refusal names the tool and the fix (``invalid_tool``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from tether.errors import ConfigError


class InvalidTool(ConfigError):
    """A tool declaration that cannot work as written; the message names the tool and how
    to declare it."""

    code = "invalid_tool"


# Each function a tool may declare beside its own, with the arguments tether calls it with.
CALLED_WITH = {
    "preview": "(arguments, scope)",
    "guard": "(arguments, scope, ctx)",
    "permitted": "(arguments, scope)",
    "needs_confirmation": "(arguments, scope)",
    "reconcile": "(key, ctx)",
    "quorum": "(arguments, scope)",
}


def check_signature(tool: str, role: str, fn: object) -> None:
    """Refuse a ``role`` function (``CALLED_WITH``) that cannot be called with the arguments
    tether passes it. One whose signature Python cannot tell (some builtins) is trusted."""
    if fn is None or isinstance(fn, bool) or not callable(fn):
        return  # absent, or a constant (``needs_confirmation``: checked by ``check_safe``)
    shape = CALLED_WITH[role]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(shape.count(",") + 1))
    except TypeError:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise InvalidTool(
            f"tool {tool}: {role} must take {shape}: tether calls {role}{shape}, but "
            f"{name}{signature} cannot be called that way. Declare it as "
            f"def {role}{shape}: ..."
        ) from None


def check_numbers(tool: str, *, seconds: Mapping[str, object], retries: object) -> None:
    """Each timeout in ``seconds`` (field → value) is a finite number > 0; ``retries`` is a
    whole number >= 0."""
    for field, timeout in seconds.items():
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ConfigError(f"tool {tool}: {field} must be a number of seconds, not {timeout!r}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(f"tool {tool}: {field} must be > 0 and finite, not {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"tool {tool}: retries must be a whole number >= 0, not {retries!r}")


def check_concurrent(tool: str, concurrent: object, *, confirms: bool) -> None:
    """``concurrent`` is a bool, and never on a tool whose calls may need confirmation: a
    decided call always runs alone, after its decision. (On a read it changes nothing:
    reads already run concurrently.)"""
    if not isinstance(concurrent, bool):
        raise InvalidTool(f"tool {tool}: concurrent must be True or False, not {concurrent!r:.100}")
    if concurrent and confirms:
        raise InvalidTool(
            f"tool {tool}: concurrent=True on a tool that may need confirmation: a call a "
            "human decides always runs alone, after its decision. Drop concurrent, or "
            "needs_confirmation."
        )


def arguments_of(
    func: Callable[..., Any], tool: str, context: type
) -> tuple[type[BaseModel], bool]:
    """The pydantic model of the arguments the model gives ``func``, and whether its first
    parameter receives the call's ``context`` (annotated with that type)."""
    try:
        hints = get_type_hints(func, include_extras=True)
    except NameError as exc:
        raise InvalidTool(
            f"tool {tool}: its annotation {exc.name!r} cannot be resolved; import it where "
            "the function is defined (not only under TYPE_CHECKING)"
        ) from exc
    params = list(inspect.signature(func).parameters.values())
    takes_context = bool(params) and hints.get(params[0].name) is context
    fields: dict[str, Any] = {}
    for position, param in enumerate(params[1:] if takes_context else params):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidTool(f"tool {tool}: *args/**kwargs are not supported; name each argument")
        if hints.get(param.name) is context:
            raise InvalidTool(
                f"tool {tool}: `{param.name}: {context.__name__}` must be its first parameter"
            )
        if param.name not in hints:
            raise InvalidTool(_unannotated(tool, param.name, first=position == 0, context=context))
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    model = create_model(f"{tool}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return model, takes_context


def _unannotated(tool: str, name: str, *, first: bool, context: type) -> str:
    fix = f"annotate it with the type the model must give (`{name}: str`, ...)"
    if first:
        fix = (
            f"to receive the call's context, annotate the first parameter "
            f"`{name}: {context.__name__}`; if the model gives it, {fix}"
        )
    return (
        f"tool {tool}: parameter {name!r} has no annotation, so the model would be asked for "
        f"it as an untyped argument: {fix}"
    )
