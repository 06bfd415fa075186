"""The one abstract model call every adapter implements.

Messages are stored and exchanged in OpenAI chat format (provider-neutral for us): a list
of ``{"role": "system"|"user"|"assistant"|"tool", ...}`` dicts, assistant tool calls as
``{"id", "type": "function", "function": {"name", "arguments": JSON-string}}`` and tool
results as ``{"role": "tool", "tool_call_id", "content"}``. Adapters translate at the edge.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tether.errors import ConfigError, ModelError

Message = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token usage the provider reported for one call."""

    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool as the model sees it: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI Chat Completions ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    """One model turn: the assistant message (OpenAI format), its usage, and the model name
    used for pricing."""

    message: Message
    usage: Usage
    model: str


class Model(ABC):
    """A chat model with tool calling. One call, no hidden state: everything the model knows
    is in ``messages``, so a resumed run gets exactly what the model saw before."""

    name: str = "model"

    @abstractmethod
    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        """Ask for the next assistant turn given the whole history and the tools."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most models hold nothing
        """Release clients the adapter holds."""


# Local servers (vLLM, Ollama, llama.cpp, proxies) accept any key, but the SDKs insist on one.
PLACEHOLDER_API_KEY = "not-set"


def sdk_credentials(
    name: str,
    *,
    api_key: str | None,
    base_url: str | None,
    key_vars: tuple[str, ...],
    base_var: str,
) -> tuple[str | None, str | None]:
    """The API key and base URL to give a provider SDK's client. Without any credentials
    the SDK would fail only at the first request, so say so now; a base URL (a local
    server) may need none, and gets a placeholder key."""
    resolved_base = base_url or os.environ.get(base_var) or None
    if api_key or any(os.environ.get(var) for var in key_vars):
        return api_key, resolved_base
    if not resolved_base:
        raise ConfigError(
            f"{name} needs an API key: set {key_vars[0]}, or {base_var} for a local server "
            "that needs none"
        )
    return PLACEHOLDER_API_KEY, resolved_base


def provider_message(body: object) -> str | None:
    """The human-readable message of a provider's error body, wrapped in ``error`` or not."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    if isinstance(body, str) and body:
        return body
    return None


# Statuses worth asking again later (reference §13): a request timeout, a conflict, rate
# limiting, and any 5xx, Anthropic's 529 "overloaded" included. Every other 4xx says the
# request itself is wrong (bad key, bad model, bad schema): the same request fails again.
TRANSIENT_STATUSES = frozenset({408, 409, 429})


def transient_status(status: int | None) -> bool:
    """Whether a provider's HTTP status is a transient failure."""
    return status is not None and (status in TRANSIENT_STATUSES or 500 <= status <= 599)


def model_error(
    exc: Exception,
    name: str,
    timeout_s: float,
    *,
    status_error: type[Exception],
    timeout_error: type[Exception],
    connection_error: type[Exception],
) -> ModelError:
    """A ``ModelError`` naming the HTTP status and the provider's message, from an SDK
    exception, marked ``transient`` or not (reference §13); each SDK passes its own exception
    classes. Timeouts and connection errors are transient; a reply that cannot be read is
    not. This is the error of the whole call, after the SDK's own retries: one call."""
    if isinstance(exc, status_error):
        status = getattr(exc, "status_code", None)
        detail = provider_message(getattr(exc, "body", None)) or getattr(exc, "message", str(exc))
        return ModelError(
            f"{name} failed with HTTP {status}: {detail}",
            status=status,
            transient=transient_status(status),
        )
    # The SDKs' timeout error is a connection error too: test it first.
    if isinstance(exc, timeout_error):
        return ModelError(f"{name} timed out after {timeout_s:g}s", transient=True)
    if isinstance(exc, connection_error):
        message = f"{name} could not be reached: {getattr(exc, 'message', exc)}"
        return ModelError(message, transient=True)
    return ModelError(f"{name} failed: {exc}")
