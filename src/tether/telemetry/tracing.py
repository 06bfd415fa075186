"""OpenTelemetry spans for a run (reference §11): every span of tether is made here.

The rest of the code calls the small functions and context managers below. They cost
nothing but a check when the ``otel`` extra is not installed or no tracer provider is
configured: no span object is made. Nor is OpenTelemetry imported unless tracing is in use:
``use_provider`` was given a provider, the application imported ``opentelemetry.trace``
(which setting a global provider takes), or ``export.exporting`` configured an exporter. The
library uses the global tracer provider the application configured; ``use_provider``
hands it another one (tests, or an application that keeps its own).

The spans of one run, all in one trace whatever the process:

- ``create_run AGENT`` (in ``Engine.start_run``): a child of the caller's span, if any.
  Its W3C trace context is stored with the run (``runs.trace_context``), and every later
  span of the run is parented on it, so a run resumed after an approval, a crash or a
  continuation, in whatever process, continues the same trace.
- ``invoke_agent AGENT``: the run's stretch in one process (a worker carrying it, a
  reaper recovering it), ``tether.run.stretch`` = ``carry`` | ``recover``, ending with
  ``tether.run.outcome`` (how it stopped);
- ``step N`` under it: one model turn and its tool calls (``tether.step.resumed`` for the
  rest of a step begun in another process);
- ``chat MODEL`` (GenAI conventions: ``gen_ai.operation.name``, ``gen_ai.provider.name``,
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.*_tokens``; a failed
  call records its error and ``error.type``);
- ``execute_tool TOOL`` (``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``tether.tool.effect``, ``tether.idempotency_key``, ``tether.tool.outcome``: ok, error,
  refused, suspended, halted, failed; ``tether.tool.error``: the refusal's code);
- ``approval TOOL``: one human decision, in the process that carries it (an HTTP request,
  ``tether approve``), with the decision, approver, whether it was edited, and
  ``tether.approval.outcome`` (executed, declined, changed, guard_failed,
  no_longer_permitted, already_resumed, unknown_or_expired, ...); the decided call's
  ``execute_tool`` span is its child;
- ``continue_run``: an owner's grant to a halted run.

Content (reference §20) is on spans only with ``content`` (``TETHER_OTEL_CONTENT=1``, the
engine's ``Settings.otel_content``, which its callers pass): then ``chat`` carries
``gen_ai.input.messages`` and ``gen_ai.output.messages``, ``execute_tool``
``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result``, ``approval``
``tether.approval.reason.text``, and a recorded exception its message. Without it an error
is recorded by its type and frames (``content.frames``), never its message; every other
attribute above is an id, a name, a count or a code, never content.

An exporter never fails or slows a run: spans go through the provider's span processor
(tether's own processes use a ``BatchSpanProcessor``, which exports off the run's path).
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from tether.errors import TetherError
from tether.telemetry import content as _content

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from tether.models.base import ModelResponse
    from tether.results import Outcome

log = logging.getLogger(__name__)

Attr = str | int | float | bool | None

_api: ModuleType | None = None  # ``opentelemetry.trace``, once imported
_missing = False  # the extra is not installed
_provider: TracerProvider | None = None  # ``use_provider``'s, else the global one
_tracers: dict[int, tuple[Any, Tracer]] = {}
# The tool call span being carried out in this task, for the writes that learn its outcome.
_tool: contextvars.ContextVar[Traced | None] = contextvars.ContextVar("tether_tool", default=None)


def _otel() -> ModuleType | None:
    """``opentelemetry.trace`` when tracing may be in use: a provider was handed to
    ``use_provider``, or the process imported the API already (a global provider is set
    through it); None otherwise, and without the extra. Importing the API costs tens of
    milliseconds a process that traces nothing need not pay."""
    if _api is None and _provider is None and "opentelemetry.trace" not in sys.modules:
        return None
    return _load()


def _load() -> ModuleType | None:
    """``opentelemetry.trace``, imported on first call; None without the extra."""
    global _api, _missing
    if _api is None and not _missing:
        try:
            from opentelemetry import trace
        except ImportError:
            _missing = True
            return None
        _api = trace
    return _api


def use_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` instead of the global one (None: the global one again).
    OpenTelemetry's global provider can be set once per process; this can be set anytime."""
    global _provider
    _provider = provider


def _tracer() -> Tracer | None:
    """Our tracer, or None when tracing is off (no extra, or no provider configured)."""
    trace = _otel()
    if trace is None:
        return None
    provider = _provider or trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = (provider, provider.get_tracer("tether"))
        _tracers[id(provider)] = cached
    return cached[1]


def on() -> bool:
    """Whether spans are made: the extra is installed and a tracer provider configured."""
    return _tracer() is not None


class Traced:
    """A span of ours, or nothing when tracing is off: ``set`` is then a no-op."""

    __slots__ = ("content", "outcome", "span")

    def __init__(self, span: Span | None = None, *, content: bool = False) -> None:
        self.span = span
        self.content = content  # content may be on this span (``TETHER_OTEL_CONTENT``)
        self.outcome: str | None = None

    def set(self, key: str, value: Attr) -> None:
        if self.span is not None and value is not None:
            self.span.set_attribute(key, value)

    def set_content(self, key: str, value: Any) -> None:
        """An attribute that is content: set only when this span may carry content."""
        if self.span is not None:
            self.set(key, _content.shown(value, self.content))

    def set_outcome(self, key: str, value: str | None) -> None:
        """The span's outcome, once: the first that is told wins."""
        if self.outcome is None and value is not None:
            self.outcome = value
            self.set(key, value)

    def stopped(self, outcome: Outcome) -> None:
        """How the run's stretch ended."""
        self.set("tether.run.outcome", outcome.kind.value)
        self.set("tether.run.reason", outcome.reason)

    def answered(self, response: ModelResponse) -> None:
        """What a model call answered (GenAI conventions)."""
        self.set_content("gen_ai.output.messages", [response.message])
        self.set("gen_ai.response.model", response.model)
        self.set("gen_ai.usage.input_tokens", response.usage.input_tokens)
        self.set("gen_ai.usage.output_tokens", response.usage.output_tokens)

    def carrier(self) -> dict[str, str] | None:
        """This span's W3C trace context (``traceparent``, ``tracestate``), to store."""
        trace = _otel()
        if self.span is None or trace is None or not self.span.get_span_context().is_valid:
            return None
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(self.span))
        return carrier or None


_OFF = Traced()


def _parent(carrier: Mapping[str, Any] | None) -> Context | None:
    """The context a stored trace context names; None (the current one) without one."""
    if not carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({k: str(v) for k, v in carrier.items()})


def _error_type(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return str(status) if status is not None else getattr(exc, "code", type(exc).__name__)


@contextmanager
def _span(
    name: str,
    attributes: Mapping[str, Attr],
    *,
    parent: Mapping[str, Any] | None = None,
    client: bool = False,
    refusal_key: str | None = None,
    content: bool = False,
    private: Mapping[str, Any] | None = None,
) -> Iterator[Traced]:
    """A span, current inside; parented on the stored ``parent`` trace context if given
    (with a link to the span that was current, if any), else on the current span. An
    error is recorded on it; a ``TetherError`` is the answer (its code under
    ``refusal_key``), not a failure, where the span names one. ``private``: attributes
    that are content, set only with ``content``."""
    tracer = _tracer()
    if tracer is None:
        yield _OFF
        return
    from opentelemetry.trace import Link, SpanKind, get_current_span

    links = []
    context = _parent(parent)
    if context is not None and get_current_span().get_span_context().is_valid:
        links.append(Link(get_current_span().get_span_context()))
    attrs = {k: v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
        attributes=attrs,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        traced = Traced(span, content=content)
        for key, value in (private or {}).items():
            traced.set_content(key, value)
        try:
            yield traced
        except TetherError as exc:
            if refusal_key is None:
                _failed(span, exc, content)
            else:
                traced.set_outcome(refusal_key, exc.code)
            raise
        except Exception as exc:
            _failed(span, exc, content)
            raise


def _recorded(span: Span, exc: BaseException, content: bool) -> None:
    """``exc`` as the span's ``exception`` event: its message only with ``content``."""
    if content:
        span.record_exception(exc)
        return
    span.add_event(
        "exception",
        {"exception.type": _content.kind(exc), "exception.stacktrace": _content.frames(exc)},
    )


def _failed(span: Span, exc: Exception, content: bool) -> None:
    from opentelemetry.trace import Status, StatusCode

    _recorded(span, exc, content)
    span.set_attribute("error.type", _error_type(exc))
    span.set_status(Status(StatusCode.ERROR, _content.described(exc, content, 300)))


# -- the spans of a run ------------------------------------------------------------------------


@contextmanager
def run_created(
    run_id: str, user_id: str, agent: str, *, content: bool = False
) -> Iterator[Traced]:
    """The run's first span, around its creation; its ``carrier()`` is what to store."""
    attrs = {
        "tether.run.id": run_id,
        "tether.user.id": user_id,
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": run_id,
    }
    with _span(f"create_run {agent}", attrs, content=content) as traced:
        yield traced


@contextmanager
def stretch(
    run_id: str,
    trace_context: Mapping[str, Any] | None,
    agent: str,
    kind: str,
    *,
    content: bool = False,
) -> Iterator[Traced]:
    """The run's stretch in this process (``kind``: carry, recover), in the run's trace."""
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "gen_ai.conversation.id": run_id,
        "tether.run.id": run_id,
        "tether.run.stretch": kind,
    }
    with _span(f"invoke_agent {agent}", attrs, parent=trace_context, content=content) as traced:
        yield traced


@contextmanager
def action(
    name: str,
    run_id: str | None,
    trace_context: Mapping[str, Any] | None,
    attrs: Mapping[str, Attr],
    *,
    outcome_key: str = "tether.results",
    content: bool = False,
    private: Mapping[str, Any] | None = None,
) -> Iterator[Traced]:
    """A decision about the run made outside its stretches (an approval, a continuation),
    in the run's trace; a refusal (``TetherError``) is its outcome (``outcome_key``).
    ``private``: its attributes that are content, set only with ``content``."""
    attrs = {"tether.run.id": run_id, **attrs}
    with _span(
        name,
        attrs,
        parent=trace_context,
        refusal_key=outcome_key,
        content=content,
        private=private,
    ) as traced:
        yield traced


class Steps:
    """The open step span of a stretch: a step is one model turn and its tool calls, so
    one opens before each model call (or for the rest of a step begun elsewhere) and
    closes when the next opens or the stretch ends."""

    def __init__(self, *, content: bool = False) -> None:
        self.content = content
        self._span: Span | None = None
        self._token: Token[Context] | None = None

    def open(self, number: int, *, resumed: bool = False) -> None:
        self.close()
        tracer = _tracer()
        trace = _otel()
        if tracer is None or trace is None:
            return
        from opentelemetry import context

        attrs = {"tether.step": number, "tether.step.resumed": resumed}
        self._span = tracer.start_span(f"step {number}", attributes=attrs)
        self._token = context.attach(trace.set_span_in_context(self._span))

    def close(self) -> None:
        if self._span is None:
            return
        from opentelemetry import context

        if self._token is not None:
            context.detach(self._token)
        self._span.end()
        self._span = None
        self._token = None

    def __enter__(self) -> Steps:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._span is not None and isinstance(exc, Exception):
            _recorded(self._span, exc, self.content)
        self.close()


@contextmanager
def model_call(
    model_name: str, step: int, *, content: bool = False, messages: Any = None
) -> Iterator[Traced]:
    """One model call, ``chat MODEL``; ``model_name`` is ``PROVIDER:MODEL``; ``messages``
    (what it is sent) are on it only with ``content``."""
    provider, colon, model = model_name.partition(":")
    if not colon:
        provider, model = model_name, model_name
    attrs: dict[str, Attr] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "tether.step": step,
    }
    private = {"gen_ai.input.messages": messages}
    with _span(f"chat {model}", attrs, client=True, content=content, private=private) as traced:
        yield traced


@contextmanager
def tool_call(
    name: str,
    call_id: str,
    *,
    key: str,
    effect: str | None,
    content: bool = False,
    arguments: Any = None,
) -> Iterator[Traced]:
    """One tool call, from the moment it is processed until its result is stored or the
    run stops on it; the store writes in between tell its outcome (``tool_result``).
    Its ``arguments`` are on it only with ``content``."""
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "tether.tool.effect": effect,
        "tether.idempotency_key": key,
    }
    private = {"gen_ai.tool.call.arguments": arguments}
    with _span(f"execute_tool {name}", attrs, content=content, private=private) as traced:
        if traced.span is None:
            yield traced
            return
        token = _tool.set(traced)
        try:
            yield traced
        finally:
            _tool.reset(token)


def tool_outcome(status: str, *, counted: bool, code: Any = None, result: Any = None) -> None:
    """The stored result of the tool call in hand: ok, error (the tool ran and failed) or
    refused (it did not run: ``code`` says why); the ``result`` itself only where the
    span may carry content."""
    traced = _tool.get()
    if traced is not None:
        traced.set_content("gen_ai.tool.call.result", result)
        outcome = "ok" if status == "ok" else "error" if counted else "refused"
        traced.set_outcome("tether.tool.outcome", outcome)
        traced.set("tether.tool.error", code if isinstance(code, str) else None)


def tool_note(key: str, value: Attr) -> None:
    """An attribute of the tool call in hand (e.g. what reconciling it found)."""
    traced = _tool.get()
    if traced is not None:
        traced.set(key, value)
