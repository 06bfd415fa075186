"""What the adapters over a provider's official SDK share: ``ProviderModel``, and
``SDKModel`` for the SDKs built alike.

An adapter (``openai.py``, ``anthropic.py``) names its SDK's client class, environment
variables and exception classes, and translates messages, tools and the streamed reply;
``SDKModel`` finds the credentials, builds the client (the SDK's own retries and timeout),
turns whatever the call raises into ``ModelError`` and closes the client it built. An SDK
built otherwise (``gemini.py``) says itself, on ``ProviderModel``, how its client is built
and closed and how its failures read.

A streamed call can also fail after its HTTP status said yes: the provider sends an error
in the stream, the connection drops or stalls (the SDKs let the HTTP client's exceptions
through once a stream is open), or the stream ends before its final event. These are
classified by the same ``model_error`` as the errors before the stream.
"""

from __future__ import annotations

import logging
import os
import sys
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypedDict, TypeVar

import httpx

from tether.errors import ConfigError, ModelError
from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec
from tether.telemetry.content import kind

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


# Statuses worth asking again later (reference §10): a request timeout, a conflict, rate
# limiting, and any 5xx, Anthropic's 529 "overloaded" included. Every other 4xx says the
# request itself is wrong (bad key, bad model, bad schema): the same request fails again.
TRANSIENT_STATUSES = frozenset({408, 409, 429})


def transient_status(status: int | None) -> bool:
    """Whether a provider's HTTP status is a transient failure."""
    return status is not None and (status in TRANSIENT_STATUSES or 500 <= status <= 599)


# The providers' error types for what the permanent 4xx statuses say: the request itself is
# wrong. An error sent in the middle of a stream has no status of its own (the stream's was
# 200), so its type decides: any other (server error, overloaded, rate limit) is transient.
PERMANENT_ERROR_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
    }
)


def error_type(body: object) -> str | None:
    """The ``type`` of a provider's error body, wrapped in ``error`` or not."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("type"), str):
            return str(inner["type"])
    return None


class IncompleteStream(Exception):
    """A stream that ended, cleanly at the HTTP level, before its final event: the reply
    was cut short somewhere between the provider and us."""


@dataclass(frozen=True, kw_only=True)
class SDKErrors:
    """An SDK's exception classes: the root of all it raises, and the four we tell apart
    (``api``: an error the API reported, in a stream too; the other three derive from it)."""

    base: type[Exception]
    api: type[Exception]
    status: type[Exception]
    timeout: type[Exception]
    connection: type[Exception]


def model_error(exc: Exception, name: str, timeout_s: float, errors: SDKErrors) -> ModelError:
    """A ``ModelError`` naming the HTTP status and the provider's message, from what a call
    raised, marked ``transient`` or not (reference §10). Timeouts, connection errors (a
    connection lost mid-stream too) and a stream cut short are transient; an error sent in
    the stream is transient unless its type says the request is wrong; a reply that cannot
    be read is not. This is the error of the whole call, after the SDK's own retries."""
    body = getattr(exc, "body", None)
    detail = provider_message(body) or getattr(exc, "message", str(exc))
    status = getattr(exc, "status_code", None)
    # A status error raised for an error event of a stream carries the stream's 200.
    if isinstance(exc, errors.status) and isinstance(status, int) and status >= 400:
        return ModelError(
            f"{name} failed with HTTP {status}: {detail}",
            status=status,
            transient=transient_status(status),
        )
    if not_connected(exc):
        return ModelError(f"{name} could not be reached: {detail}", transient=True)
    # The timeout errors are connection errors too: test them first.
    if isinstance(exc, (errors.timeout, httpx.TimeoutException)):
        return ModelError(f"{name} timed out after {timeout_s:g}s", transient=True)
    if isinstance(exc, errors.connection):
        return ModelError(f"{name} could not be reached: {detail}", transient=True)
    if isinstance(exc, httpx.TransportError):
        return ModelError(f"{name} broke off its reply: {exc}", transient=True)
    if isinstance(exc, IncompleteStream):
        return ModelError(f"{name} ended its reply too soon: {exc}", transient=True)
    if isinstance(exc, errors.api):
        kind = error_type(body)
        return ModelError(
            f"{name} failed mid-stream ({kind or 'unknown error'}): {detail}",
            transient=kind not in PERMANENT_ERROR_TYPES,
        )
    return ModelError(f"{name} failed: {exc}")


def not_connected(exc: BaseException) -> bool:
    """Whether ``exc`` came of a connection that could not be made (refused, no route, a
    name that does not resolve). aiohttp's transport reports those as a connect timeout
    (``httpx_aiohttp`` maps every ``ClientConnectionError`` so), which they are not; its
    own ``ClientConnectorError`` is in the chain. Looked up, not imported: aiohttp is
    loaded only once a request went through it."""
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None:
        return False
    seen: BaseException | None = exc
    for _ in range(8):  # the SDK's error, httpx's, aiohttp's: a short chain
        if seen is None:
            return False
        if isinstance(seen, aiohttp.ClientConnectorError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        timeout: float,
        max_retries: int,
        http_client: httpx.AsyncClient,
    ) -> ClientT_co: ...


# The connections an adapter's HTTP client may hold: no cap of its own (a worker's
# ``--concurrency`` bounds the requests in flight), kept alive between a run's steps.
CONNECTIONS = httpx.Limits(max_connections=100_000, max_keepalive_connections=100_000)


class SDKOptions(TypedDict, total=False):
    """``SDKModel``'s keyword arguments but ``client``, for an adapter that adds its own."""

    base_url: str | None
    api_key: str | None
    timeout_s: float
    max_retries: int


C = TypeVar("C")


class ProviderModel(Model, Generic[C]):
    """A model reached through its provider's SDK, named ``PROVIDER:MODEL``, whatever the
    SDK: the credentials (``key_vars``, ``base_var``), the client it builds or is given
    (an injected ``client`` is used as it is and left open), the call streamed, and
    whatever the call raises turned into ``ModelError`` and logged. An adapter says how to
    build and close its SDK's client, which exceptions are its provider's failures, and how
    they read as ``ModelError``; ``SDKModel`` says so for the SDKs built alike (OpenAI's
    and Anthropic's), and ``gemini.py`` for Google's.
    """

    provider: ClassVar[str]
    key_vars: ClassVar[tuple[str, ...]]
    base_var: ClassVar[str]

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        client: C | None = None,
    ) -> None:
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.timeout_s = timeout_s
        self._owns_client = client is None
        self._client = (
            client if client is not None else self._new_client(base_url, api_key, max_retries)
        )

    def _credentials(
        self, base_url: str | None, api_key: str | None
    ) -> tuple[str | None, str | None]:
        """The API key and base URL for a new client (``sdk_credentials``)."""
        return sdk_credentials(
            self.name,
            api_key=api_key,
            base_url=base_url,
            key_vars=self.key_vars,
            base_var=self.base_var,
        )

    @abstractmethod
    def _new_client(self, base_url: str | None, api_key: str | None, max_retries: int) -> C:
        """The SDK's client, with its own retries (``max_retries``)."""

    @abstractmethod
    async def _close_client(self) -> None:
        """Close the client this adapter built."""

    @abstractmethod
    def _failures(self) -> tuple[type[Exception], ...]:
        """What a call may raise that is a failure of the provider or of the way to it."""

    @abstractmethod
    def _model_error(self, exc: Exception) -> ModelError:
        """The ``ModelError`` of a failure ``_failures`` names (reference §10)."""

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        """One call through the SDK (streamed, its text unused)."""
        return await self.stream(messages, tools, _discard)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """One streamed call through the SDK; whatever the SDK, the HTTP client under it
        or a stream cut short raises becomes ``ModelError``."""
        try:
            return await self._call(messages, tools, on_text)
        except self._failures() as exc:
            error = self._model_error(exc)
            # The provider's message may quote what it was sent: the run's log line
            # carries it, with TETHER_LOG_CONTENT (``model_failures.py``).
            told = {"action": "model_error", "model": self.name, "status": error.status}
            log.warning("model call failed", extra={**told, "error_type": kind(exc)})
            raise error from exc

    @abstractmethod
    async def _call(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """The provider's call: history and tools in its format, its reply in ours, the
        reply's text handed to ``on_text`` as it is written."""

    async def aclose(self) -> None:
        """Close the client this adapter created; an injected one is the caller's."""
        if self._owns_client:
            await self._close_client()


class SDKModel(ProviderModel[ClientT]):
    """A model reached through an SDK built as OpenAI's and Anthropic's are: a client class
    that takes the key, base URL, timeout, retries and an HTTP client (on aiohttp), and
    exceptions ``SDKErrors`` names, classified by ``model_error``.
    """

    errors: ClassVar[SDKErrors]
    client_class: ClientClass[ClientT]
    # The SDK's HTTP client on aiohttp (its ``aiohttp`` extra), which both SDKs offer "for
    # improved concurrency": httpx's connection pool walks every connection for each
    # request, so a worker with 1,000 runs in flight spent more on the pool than on the
    # requests (benchmarks/capacity.py).
    http_client_class: ClassVar[Callable[..., httpx.AsyncClient]]

    def _new_client(self, base_url: str | None, api_key: str | None, max_retries: int) -> ClientT:
        api_key, resolved_base = self._credentials(base_url, api_key)
        return self.client_class(
            api_key=api_key,
            base_url=resolved_base,
            timeout=self.timeout_s,
            max_retries=max_retries,
            http_client=self.http_client_class(timeout=self.timeout_s, limits=CONNECTIONS),
        )

    async def _close_client(self) -> None:
        await self._client.close()

    def _failures(self) -> tuple[type[Exception], ...]:
        return (self.errors.base, httpx.TransportError, IncompleteStream)

    def _model_error(self, exc: Exception) -> ModelError:
        return model_error(exc, self.name, self.timeout_s, self.errors)
