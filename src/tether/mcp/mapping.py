"""An MCP tool definition as a tether ``Tool`` (reference §11), and its calls.

Annotations decide the effect: ``readOnlyHint`` true is a read; anything else is a
write, which needs confirmation unless ``destructiveHint`` is false (MCP's default is
true), and dedupes when ``idempotentHint`` is true (the server answers a repeated
idempotency key with the first result, so reconciling re-issues the call under the same
key). Overrides, per tool, replace any of that. A write is never ``concurrent`` by default;
an override may declare it so only when ``idempotentHint`` is true and ``destructiveHint``
false (``commutes``). The idempotency key travels in the call's ``_meta`` as
``"tether/idempotency_key"``.

A call's answer: ``structuredContent`` if the server gave one, else its text content.
``isError`` is a definite tool error the model sees (``ToolFailed``); a call the
connection lost may have run, so a write's outcome is unknown (reconciled by key) and a
read is unavailable (retried up to its ``retries``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from mcp import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    REQUEST_TIMEOUT,
    CallToolResult,
    TextContent,
)
from mcp_types import Tool as McpTool

from tether.errors import ConfigError
from tether.mcp.link import READ_WAIT_S
from tether.tools.json_schema import json_arguments
from tether.tools.tool import (
    DEFAULT_TIMEOUT_S,
    Confirmation,
    Effect,
    Guard,
    OutcomeUnknown,
    Permitted,
    Preview,
    Reconcile,
    Tool,
    ToolContext,
    ToolFailed,
    ToolUnavailable,
    UnsafeTool,
)

if TYPE_CHECKING:
    from tether.mcp.link import Link

KEY_META = "tether/idempotency_key"
# Error codes that say the request may have reached the server and run: the connection
# closed under it, it timed out, or the server failed (HTTP 5xx arrives as INTERNAL_ERROR).
AMBIGUOUS_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT, INTERNAL_ERROR})


class Override(TypedDict, total=False):
    """What a tether tool built from an MCP tool may declare beyond its annotations."""

    effect: Effect | str
    needs_confirmation: bool | Confirmation
    dedupes: bool
    preview: Preview
    guard: Guard
    reconcile: Reconcile
    permitted: Permitted
    accept_unreconcilable: bool
    version: str
    timeout_s: float
    retries: int
    check_timeout_s: float
    description: str
    concurrent: bool


OVERRIDABLE = frozenset(Override.__annotations__)


def definition(source: McpTool, name: str, override: Override) -> dict[str, Any]:
    """The fields of the tether tool ``name`` for the MCP tool ``source``: its
    annotations mapped, then ``override`` on top. Unknown override keys are refused."""
    unknown = sorted(set(override) - OVERRIDABLE)
    if unknown:
        raise ConfigError(
            f"MCP tool override for {name}: unknown field(s) {unknown}; "
            f"allowed: {sorted(OVERRIDABLE)}"
        )
    hints = source.annotations
    try:
        effect = Effect(
            override.get("effect", Effect.READ if hints and hints.read_only_hint else Effect.WRITE)
        )
    except ValueError as exc:
        raise ConfigError(f"MCP tool override for {name}: effect must be read or write") from exc
    write = effect is Effect.WRITE
    if write and override.get("concurrent") and not commutes(source):
        raise ConfigError(
            f"MCP tool override for {name}: concurrent=True is refused on this write: only "
            "a tool whose annotations say idempotentHint true and destructiveHint false "
            "(a repeat changes nothing, nothing is destroyed) may run beside other calls; "
            f"{source.name!r} does not say both, so its calls run alone, in order"
        )
    fields: dict[str, Any] = {
        # An effect declared by override decides what follows from it, as the hint would.
        "needs_confirmation": write and not (hints and hints.destructive_hint is False),
        "dedupes": write and bool(hints and hints.idempotent_hint),
        "description": source.description or source.title or source.name,
        "version": "mcp-" + _digest(source),
        "timeout_s": DEFAULT_TIMEOUT_S,
    }
    fields.update(override)
    fields["effect"] = effect
    return fields


def commutes(source: McpTool) -> bool:
    """Whether the server says the tool's calls may be declared ``concurrent``: idempotent
    and not destructive (never so by default: only by override)."""
    hints = source.annotations
    return bool(hints and hints.idempotent_hint is True and hints.destructive_hint is False)


def build(link: Link, source: McpTool, name: str, override: Override) -> Tool:
    """The tether tool ``name`` calling ``source`` through ``link``. An unsafe
    definition raises ``UnsafeTool`` with the override that fixes it."""
    fields = definition(source, name, override)
    try:
        return Tool(
            name=name,
            args_model=json_arguments(name, source.input_schema),
            fn=caller(link, source.name, fields["effect"]),
            takes_context=True,
            **fields,
        )
    except UnsafeTool as exc:
        raise UnsafeTool(f"MCP tool {source.name!r} (as {name}): {unsafe_fix(name, exc)}") from exc


def unsafe_fix(name: str, exc: UnsafeTool) -> str:
    """The message of an MCP write that can be neither reconciled nor re-issued: what to
    declare for it, in ``overrides`` (its server cannot say, short of ``idempotentHint``)."""
    if "neither reconcile nor dedupes" not in exc.message:
        return exc.message
    return (
        "a write without idempotentHint: after a crash tether could not tell whether it "
        f'ran. Declare it in overrides: {{"{name}": {{"reconcile": FN}}}} (finds the outcome '
        'by ctx.idempotency_key), {"dedupes": True} (the server answers a repeated '
        '"tether/idempotency_key" with the first result), {"effect": "read"} (it changes '
        'nothing), or, knowingly, {"accept_unreconcilable": True}.'
    )


def caller(link: Link, tool_name: str, effect: Effect) -> Callable[..., Any]:
    """The tool's function: one ``tools/call`` carrying the call's idempotency key. A
    closed connection is reported to ``link``, which connects again."""

    async def call(ctx: ToolContext, **arguments: Any) -> Any:
        meta: Any = {KEY_META: ctx.idempotency_key}
        client = await link.client(None if effect is Effect.WRITE else READ_WAIT_S)
        if client is None:  # a read only: a write waits as long as its timeout
            raise ToolUnavailable(f"{tool_name}: the MCP server is not connected now")
        try:
            result = await client.call_tool(tool_name, arguments, meta=meta)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                link.lost(client)
            if exc.code in AMBIGUOUS_CODES:
                raise lost(tool_name, effect, exc) from exc
            raise ToolFailed(f"{tool_name}: {exc.message}", mcp_code=exc.code) from exc
        except Exception as exc:  # the transport failed: it may have been sent and run
            link.lost(client)
            raise lost(tool_name, effect, exc) from exc
        if result.is_error:
            raise ToolFailed(f"{tool_name}: {error_text(result)}")
        return content(result)

    call.__name__ = tool_name
    return call


def lost(tool_name: str, effect: Effect, exc: Exception) -> OutcomeUnknown | ToolUnavailable:
    """A call whose answer did not arrive: a write may have run (reconciled by key); a read
    had no effect and may be tried again."""
    why = f"{tool_name}: the MCP server did not answer ({type(exc).__name__}: {exc})"[:500]
    return OutcomeUnknown(why) if effect is Effect.WRITE else ToolUnavailable(why)


def content(result: CallToolResult) -> Any:
    """What the model sees of a result: its structured content, else its text (one text
    block as a string), else the content blocks as JSON."""
    if result.structured_content is not None:
        return result.structured_content
    blocks = result.content
    if all(isinstance(b, TextContent) for b in blocks):
        texts = [b.text for b in blocks if isinstance(b, TextContent)]
        return texts[0] if len(texts) == 1 else texts
    return [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]


def error_text(result: CallToolResult) -> str:
    texts = [b.text for b in result.content if isinstance(b, TextContent)]
    return " ".join(texts)[:2000] or "the tool reported an error"


def _digest(source: McpTool) -> str:
    """Twelve hex digits of what the model and tether see of the tool: a change on the
    server shows in the versions a run records."""
    seen = {
        "name": source.name,
        "input_schema": source.input_schema,
        "annotations": source.annotations.model_dump(mode="json") if source.annotations else None,
    }
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:12]


def check_overrides(names: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
    """An override naming no tool of the servers is a mistake (a typo, a renamed tool):
    refused, naming the tools there are."""
    missing = sorted(set(overrides) - set(names))
    if missing:
        raise ConfigError(
            f"MCP tool overrides name tools the servers do not have: {missing}; "
            f"they have: {sorted(names)}"
        )
