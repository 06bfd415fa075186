"""What the adapters over a provider's official SDK share: ``SDKModel``.

An adapter (``openai.py``, ``anthropic.py``) names its SDK's client class, environment
variables and exception classes, and translates messages, tools and replies; ``SDKModel``
finds the credentials, builds the client (the SDK's own retries and timeout), turns the
SDK's exceptions into ``ModelError`` and closes the client it built.
"""

from __future__ import annotations

import logging
import os
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypedDict, TypeVar

from tether.errors import ConfigError, ModelError
from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, kw_only=True)
class SDKErrors:
    """An SDK's exception classes: the root of all it raises, and the three we tell apart."""

    base: type[Exception]
    status: type[Exception]
    timeout: type[Exception]
    connection: type[Exception]


def model_error(exc: Exception, name: str, timeout_s: float, errors: SDKErrors) -> ModelError:
    """A ``ModelError`` naming the HTTP status and the provider's message, from an SDK
    exception, marked ``transient`` or not (reference §13). Timeouts and connection errors are
    transient; a reply that cannot be read is not. This is the error of the whole call,
    after the SDK's own retries: one call."""
    if isinstance(exc, errors.status):
        status = getattr(exc, "status_code", None)
        detail = provider_message(getattr(exc, "body", None)) or getattr(exc, "message", str(exc))
        return ModelError(
            f"{name} failed with HTTP {status}: {detail}",
            status=status,
            transient=transient_status(status),
        )
    # The SDKs' timeout error is a connection error too: test it first.
    if isinstance(exc, errors.timeout):
        return ModelError(f"{name} timed out after {timeout_s:g}s", transient=True)
    if isinstance(exc, errors.connection):
        message = f"{name} could not be reached: {getattr(exc, 'message', exc)}"
        return ModelError(message, transient=True)
    return ModelError(f"{name} failed: {exc}")


def _discard(text: str) -> None:
    """A ``TextSink`` for a call whose text is wanted only once complete."""


class SDKClient(Protocol):
    """What ``SDKModel`` needs of an SDK's async client; the adapter uses the rest."""

    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=SDKClient)
ClientT_co = TypeVar("ClientT_co", bound=SDKClient, covariant=True)


class ClientClass(Protocol[ClientT_co]):
    """An SDK's client constructor, as both SDKs spell it."""

    def __call__(
        self, *, api_key: str | None, base_url: str | None, timeout: float, max_retries: int
    ) -> ClientT_co: ...


class SDKOptions(TypedDict, total=False):
    """``SDKModel``'s keyword arguments but ``client``, for an adapter that adds its own."""

    base_url: str | None
    api_key: str | None
    timeout_s: float
    max_retries: int


class SDKModel(Model, Generic[ClientT]):
    """A model reached through its provider's SDK, named ``PROVIDER:MODEL``.

    Retries and timeouts are the SDK's (``max_retries``, ``timeout_s``); an injected
    ``client`` is used as it is and left open. The key and base URL come from the
    arguments or from ``key_vars`` and ``base_var`` (``sdk_credentials``).
    """

    provider: ClassVar[str]
    key_vars: ClassVar[tuple[str, ...]]
    base_var: ClassVar[str]
    errors: ClassVar[SDKErrors]
    client_class: ClientClass[ClientT]

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        client: ClientT | None = None,
    ) -> None:
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.timeout_s = timeout_s
        self._owns_client = client is None
        self._client = (
            client if client is not None else self._new_client(base_url, api_key, max_retries)
        )

    def _new_client(self, base_url: str | None, api_key: str | None, max_retries: int) -> ClientT:
        api_key, resolved_base = sdk_credentials(
            self.name,
            api_key=api_key,
            base_url=base_url,
            key_vars=self.key_vars,
            base_var=self.base_var,
        )
        return self.client_class(
            api_key=api_key,
            base_url=resolved_base,
            timeout=self.timeout_s,
            max_retries=max_retries,
        )

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        """One call through the SDK (streamed, its text unused)."""
        return await self.stream(messages, tools, _discard)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """One streamed call through the SDK; whatever the SDK raises becomes
        ``ModelError``."""
        try:
            return await self._call(messages, tools, on_text)
        except self.errors.base as exc:
            error = model_error(exc, self.name, self.timeout_s, self.errors)
            log.warning(error.message, extra={"action": "model_error", "model": self.name})
            raise error from exc

    @abstractmethod
    async def _call(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """The provider's call: history and tools in its format, its reply in ours, the
        reply's text handed to ``on_text`` as it is written."""

    async def aclose(self) -> None:
        """Close the HTTP client this adapter created; an injected one is the caller's."""
        if self._owns_client:
            await self._client.close()
