"""Tools declared from typed Python functions.

pydantic validates the arguments and gives the JSON schema the model sees. A tool has an
effect (read or write), may need confirmation, and may have a ``preview`` (the artefact a
human approves; its digest is SHA-256 of canonical JSON), a ``guard`` (a business check
that can refuse) and a ``reconcile`` (finds a write's outcome by its idempotency key).

Safe by default: a definition that could act twice or act unchecked is refused when it is
declared (``UnsafeTool``), one that cannot work as written too (``InvalidTool``,
``tether.tools.declaration``), and a guard answer that is not an explicit allow refuses,
as does a check that does not answer within the tool's ``check_timeout_s``.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast, overload

from pydantic import BaseModel, ValidationError

from tether.errors import ConfigError, TetherError
from tether.models.base import ToolSpec
from tether.scope import Scope
from tether.telemetry.content import failure
from tether.tools import deciders, declaration
from tether.tools._timeouts import still_running, within
from tether.tools.declaration import CALLED_WITH, InvalidTool, arguments_of, check_signature
from tether.tools.verdicts import GuardResult as GuardResult
from tether.tools.verdicts import Reconciled as Reconciled
from tether.tools.verdicts import ReconcileKind as ReconcileKind

# How long a tool call may take before it is abandoned (reference §10), unless declared.
DEFAULT_TIMEOUT_S = 60.0
# How long each of its checks (permission, preview, guard, conditional confirmation,
# reconcile) may take before it counts as failed, unless declared.
DEFAULT_CHECK_TIMEOUT_S = 10.0
log = logging.getLogger(__name__)


class Effect(str, enum.Enum):
    """Whether a tool changes the world; the stored string."""

    READ = "read"  # no external effect: safe to run again after a crash
    WRITE = "write"  # an external effect: at most once per tool call id (invariant 2)


class Approvers(str, enum.Enum):
    """Who may decide a call of a tool that needs confirmation (``@tool(approvers=...)``)."""

    ANY = "any"  # the run's owner, or an approver the owner's scope names
    OTHERS = "others"  # four eyes: an approver the owner's scope names, never the owner


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool learns about the call it serves."""

    run_id: str
    user_id: str
    tool_call_id: str
    idempotency_key: str
    scope: Scope
    confirmed: bool = False
    # What the agent hands every tool (``Agent(deps=...)``): clients, URLs, settings.
    # Tools get their dependencies here, never from globals or the environment.
    deps: Any = None


class ToolFailed(TetherError):
    """A tool failed definitely: the call did not take effect. The model sees the error."""

    code = "tool_error"


class ToolUnavailable(ToolFailed):
    """A tool could not do its work now (its downstream is down or overloaded) and did not
    take effect: "try again". A read is tried again up to its ``retries``; then the model
    sees ``tool_unavailable``."""

    code = "tool_unavailable"


class OutcomeUnknown(TetherError):
    """A write failed ambiguously (timeout, dropped connection, 5xx): it may have taken
    effect. tether reconciles it by idempotency key before the loop goes on."""

    code = "outcome_unknown"


class UnsafeTool(ConfigError):
    """A tool definition that could act twice or unchecked; the message says how to
    declare it safely."""

    code = "unsafe_tool"


class InvalidToolArguments(TetherError):
    """The model's arguments do not fit the tool's schema; the model sees why."""

    code = "invalid_arguments"


Preview = Callable[[Any, Scope], Any]
Guard = Callable[[Any, Scope, ToolContext], Any]
Reconcile = Callable[[str, ToolContext], Any]
Permitted = Callable[[Any, Scope], Any]
# A confirmation that depends on the call: (validated arguments, scope) → whether a human
# must approve it (reference §9), e.g. ``lambda args, scope: args.amount > 1000``.
Confirmation = Callable[[Any, Scope], Any]


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool the model may call. Build it with ``@tool``."""

    name: str
    description: str
    args_model: type[BaseModel]
    fn: Callable[..., Any]
    takes_context: bool
    effect: Effect = Effect.READ
    # True, False, or a function of (validated arguments, scope) asked each time the call
    # is about to execute.
    needs_confirmation: bool | Confirmation = False
    # The downstream deduplicates by idempotency key (a repeated key returns the first
    # result), so reconciling may re-issue the call with the same key.
    dedupes: bool = False
    preview: Preview | None = None
    guard: Guard | None = None
    reconcile: Reconcile | None = None
    permitted: Permitted | None = None
    # Declared knowingly: a write that can be neither reconciled nor re-issued, so a crash
    # while it runs fails the run ``unreconcilable`` for a person to look at.
    accept_unreconcilable: bool = False
    version: str = "1"
    # Seconds a call may take; past them it is abandoned: a read is retried (``retries``
    # times), a write's outcome is unknown and it is reconciled (reference §10).
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = 0
    # Seconds each of its checks may take: past them one refuses the call (fails closed)
    # and a reconcile counts as unreachable.
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    # Who may decide a call that needs confirmation ("others": never the run's owner).
    approvers: Approvers = Approvers.ANY
    # A write whose effects commute with each other and with reads: it may run beside the
    # neighbouring reads and concurrent writes of its turn (reference §1).
    concurrent: bool = False
    # How many distinct people approve a call (reference §19): a number, or a function of
    # (arguments, scope) returning one, asked when the call is suspended.
    quorum: int | deciders.Quorum = 1
    # Minutes after which a call still undecided is escalated to ``escalate_to`` (users and
    # "group:NAME"), who may then decide it too (reference §19).
    escalate_after_min: float | None = None
    escalate_to: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_safe(self)
        check_timing(self)
        for role in CALLED_WITH:
            check_signature(self.name, role, getattr(self, role))
        check_approvers(self)
        deciders.check_quorum(self.name, self.quorum, confirms=self.may_confirm)
        to = deciders.check_escalation(
            self.name, self.escalate_after_min, self.escalate_to, confirms=self.may_confirm
        )
        object.__setattr__(self, "escalate_to", to)
        declaration.check_concurrent(self.name, self.concurrent, confirms=self.may_confirm)

    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    def validate(self, raw: Any) -> BaseModel:
        """Validate the model's arguments; ``InvalidToolArguments`` says what is wrong."""
        if not isinstance(raw, dict):
            raise InvalidToolArguments(
                f"arguments of {self.name} must be a JSON object, got {raw!r:.200}"
            )
        try:
            return self.args_model.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise InvalidToolArguments(f"invalid arguments for {self.name}: {problems}") from exc

    async def call(self, args: BaseModel, ctx: ToolContext) -> Any:
        """Run the tool's function, bounded by ``timeout_s`` (``TimeoutError`` past it). A
        plain function runs in a thread of its own, so a slow one never blocks the event
        loop: other runs and this run's heartbeat go on meanwhile (``tether.tools._timeouts``)."""
        positional = (ctx,) if self.takes_context else ()
        key = ctx.idempotency_key if self.effect is Effect.WRITE else None
        kwargs = args.model_dump()
        return await within(self.fn, positional, kwargs, timeout_s=self.timeout_s, key=key)

    async def render_preview(self, args: BaseModel, scope: Scope) -> dict[str, Any] | None:
        """The artefact the human approves, or None if the tool has no preview."""
        if self.preview is None:
            return None
        return cast(dict[str, Any], await self._checked("preview", self.preview, args, scope))

    async def check_guard(self, args: BaseModel, scope: Scope, ctx: ToolContext) -> GuardResult:
        """Run the guard; a tool without one allows everything. Fails closed: only an
        explicit ``GuardResult.allow()`` allows; any other answer refuses."""
        if self.guard is None:
            return GuardResult.allow()
        verdict = await self._checked("guard", self.guard, args, scope, ctx)
        if isinstance(verdict, GuardResult):
            return verdict if verdict.ok or verdict.reason else GuardResult.refuse("refused")
        return GuardResult.refuse(
            f"the guard of {self.name} answered {verdict!r:.100}, not GuardResult.allow()"
        )

    @property
    def may_confirm(self) -> bool:
        """Whether some call of this tool may need a human's confirmation."""
        return self.needs_confirmation is not False

    async def confirmation_needed(self, args: BaseModel, scope: Scope) -> bool:
        """Whether this call needs a human's confirmation now. A conditional confirmation
        that raises asks a human (fails closed)."""
        rule = self.needs_confirmation
        if isinstance(rule, bool):
            return rule
        try:
            return bool(await self._checked("conditional confirmation", rule, args, scope))
        except Exception as exc:
            # A tool knows no settings: its rule's error by its type and frames only.
            log.error("confirmation check failed", **failure(exc, False, tool=self.name))
            return True

    async def quorum_for(self, args: BaseModel, scope: Scope) -> int:
        """How many people must approve this call, asked when it is suspended: a function
        that fails, or answers anything but a whole number from 1 to ``MAX_QUORUM``,
        refuses the call (``ToolFailed``: fails closed)."""
        rule = self.quorum
        if not callable(rule):
            return rule
        try:
            value = await self._checked("quorum", rule, args, scope)
        except ToolFailed:
            raise
        except Exception as exc:  # a raising rule says nobody knows how many: refuse
            log.error("quorum check failed", **failure(exc, False, tool=self.name))
            raise ToolFailed(
                f"the quorum of {self.name} raised {type(exc).__name__}: {exc}"[:500]
            ) from exc
        return deciders.checked_quorum(self.name, value, ToolFailed)

    def may_be_decided_by(self, approver: str, owner: str) -> bool:
        """This tool's own rule on who decides its calls in ``owner``'s runs: anyone the
        owner's scope allows (checked apart), but never the owner with four eyes."""
        return self.approvers is Approvers.ANY or approver != owner

    async def is_permitted(self, args: BaseModel, scope: Scope) -> bool:
        """Whether ``scope`` still allows this call; tools without a check allow it."""
        if self.permitted is None:
            return True
        return bool(await self._checked("permission check", self.permitted, args, scope))

    async def find_outcome(self, key: str, ctx: ToolContext) -> Reconciled:
        """Ask the tool whether the write with ``key`` took effect. A reconcile that
        raises could not ask (``unreachable``: asked again later); one that returns
        something else than ``Reconciled`` cannot tell (``unknown``)."""
        if self.reconcile is None:
            return Reconciled.unknown(f"{self.name} has no reconcile")
        try:
            answer = await self._checked("reconcile", self.reconcile, key, ctx)
        except Exception as exc:
            return Reconciled.unreachable(f"{type(exc).__name__}: {exc}"[:500])
        if not isinstance(answer, Reconciled):
            return Reconciled.unknown(f"reconcile of {self.name} must return Reconciled")
        if answer.kind is ReconcileKind.ABSENT and still_running(key):
            # Absent for now: the call that overran its timeout may yet take effect.
            return Reconciled.unreachable(f"{self.name} overran its timeout and still runs")
        return answer

    async def _checked(self, role: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, one of the tool's checks, bounded by ``check_timeout_s`` as a call
        is by its timeout (``tether.tools._timeouts``): past it, ``ToolFailed``, which
        refuses the call (fails closed) or, for a reconcile, means it could not ask."""
        try:
            return await within(fn, args, {}, timeout_s=self.check_timeout_s)
        except TimeoutError as exc:
            limit = f"{self.check_timeout_s:g} s (check_timeout_s)"
            raise ToolFailed(f"the {role} of {self.name} did not answer within {limit}") from exc


def check_safe(t: Tool) -> None:
    """Refuse a definition that could act twice or unchecked (STYLE rule 11)."""
    if t.effect is Effect.WRITE and t.reconcile is None and not t.dedupes:
        if not t.accept_unreconcilable:
            raise UnsafeTool(
                f"tool {t.name} is a write with neither reconcile nor dedupes: after a crash "
                "tether could not tell whether it ran. Declare reconcile=FN (finds the "
                "outcome by ctx.idempotency_key), or dedupes=True (the downstream returns "
                "the first result for a repeated idempotency key), or, knowingly, "
                "accept_unreconcilable=True (a crash mid-call then fails the run)."
            )
    if not isinstance(t.needs_confirmation, bool) and not callable(t.needs_confirmation):
        raise UnsafeTool(
            f"tool {t.name}: needs_confirmation must be True, False or a function of "
            f"(arguments, scope), not {t.needs_confirmation!r:.100}"
        )
    if t.preview is not None and not t.may_confirm:
        raise UnsafeTool(
            f"tool {t.name} has a preview but needs no confirmation, so nobody would see "
            "it. Declare needs_confirmation=True, or drop the preview."
        )


def check_approvers(t: Tool) -> None:
    """``approvers`` is "any" or "others" (stored as ``Approvers``), and "others" goes with
    a confirmation (there is nothing to decide otherwise)."""
    if isinstance(t.approvers, bool) or t.approvers not in tuple(Approvers):
        raise ConfigError(
            f"tool {t.name}: approvers must be 'any' (the run's owner or an approver of the "
            f"owner's scope) or 'others' (never the owner), not {t.approvers!r:.100}"
        )
    object.__setattr__(t, "approvers", Approvers(t.approvers))
    if t.approvers is Approvers.OTHERS and not t.may_confirm:
        raise ConfigError(
            f"tool {t.name}: approvers='others' rules who decides a confirmation, and this "
            "tool needs none. Declare needs_confirmation, or drop approvers."
        )


def check_timing(t: Tool) -> None:
    """Refuse a timeout or retry count that cannot work, and retries on a write: a write
    is never run again blindly (a timed-out one is reconciled by its key instead)."""
    seconds = {"timeout_s": t.timeout_s, "check_timeout_s": t.check_timeout_s}
    declaration.check_numbers(t.name, seconds=seconds, retries=t.retries)
    if t.effect is Effect.WRITE and t.retries:
        raise UnsafeTool(
            f"tool {t.name} is a write with retries={t.retries}: tether never runs a write "
            "again blindly. A write that times out or fails ambiguously is reconciled by its "
            "idempotency key instead (reconcile=, dedupes=). Drop retries (reads only)."
        )


def effect_of(tool: str, effect: object) -> Effect:
    """The declared effect, or ``invalid_tool`` naming the two there are."""
    try:
        return Effect(effect)
    except ValueError:
        message = f"tool {tool}: effect must be 'read' or 'write', got {effect!r}"
        raise InvalidTool(message) from None


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str = Effect.READ,
    needs_confirmation: bool | Confirmation = False,
    dedupes: bool = False,
    preview: Preview | None = None,
    guard: Guard | None = None,
    reconcile: Reconcile | None = None,
    permitted: Permitted | None = None,
    accept_unreconcilable: bool = False,
    version: str = "1",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retries: int = 0,
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
    approvers: Approvers | str = Approvers.ANY,
    concurrent: bool = False,
    quorum: int | deciders.Quorum = 1,
    escalate_after_min: float | None = None,
    escalate_to: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str = Effect.READ,
    needs_confirmation: bool | Confirmation = False,
    dedupes: bool = False,
    preview: Preview | None = None,
    guard: Guard | None = None,
    reconcile: Reconcile | None = None,
    permitted: Permitted | None = None,
    accept_unreconcilable: bool = False,
    version: str = "1",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retries: int = 0,
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
    approvers: Approvers | str = Approvers.ANY,
    concurrent: bool = False,
    quorum: int | deciders.Quorum = 1,
    escalate_after_min: float | None = None,
    escalate_to: tuple[str, ...] = (),
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a typed function. A first parameter annotated ``ToolContext``
    receives the call's context; every other parameter is an argument the model gives."""

    def build(func: Callable[..., Any]) -> Tool:
        tool_name = name or func.__name__
        model, takes_context = arguments_of(func, tool_name, ToolContext)
        doc = inspect.getdoc(func) or ""
        return Tool(
            name=tool_name,
            description=description or doc or tool_name,
            args_model=model,
            fn=func,
            takes_context=takes_context,
            effect=effect_of(tool_name, effect),
            needs_confirmation=needs_confirmation,
            dedupes=dedupes,
            preview=preview,
            guard=guard,
            reconcile=reconcile,
            permitted=permitted,
            accept_unreconcilable=accept_unreconcilable,
            version=version,
            timeout_s=timeout_s,
            retries=retries,
            check_timeout_s=check_timeout_s,
            approvers=cast(Approvers, approvers),  # checked and converted by the Tool
            concurrent=concurrent,
            quorum=quorum,
            escalate_after_min=escalate_after_min,
            escalate_to=escalate_to,
        )

    return build(fn) if fn is not None else build
