"""The ``gemini:`` adapter: the Gemini API through Google's ``google-genai`` SDK.

tether keeps history in OpenAI chat format; this module translates it to Gemini's contents
at the edge (system messages as the system instruction, the assistant as role ``model``
with ``function_call`` parts, tool results as ``function_response`` parts of a user turn,
named after the call they answer) and the reply back. Every call streams: the chunks are
put back together as the turn they stream (``StreamedTurn``), its text handed on as it
arrives.

The retries are the SDK's own (``max_retries``). The timeout bounds the wait for the
reply's first chunk and for each next one, as the other adapters' timeouts do; it is not
the SDK's, which bounds the whole call, so that a long reply still streaming would be cut
off at it (and cut off again at each retry of the run).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import sys
from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast

import aiohttp
import httpx
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tether.errors import ModelError
from tether.models.base import (
    Message,
    ModelResponse,
    TextSink,
    ToolSpec,
    Usage,
    arguments_of,
    text_of,
)
from tether.models.sdk import (
    IncompleteStream,
    ProviderModel,
    not_connected,
    transient_status,
)

Part = dict[str, Any]
Content = dict[str, Any]

# Gemini 3 models want each function call of the history sent back with the thought
# signature they gave it. tether's one format has no place for one, and a call another
# provider wrote never had one: this is the placeholder the Gemini API documents for such
# a history, which tells it not to check. The SDK sends bytes as URL-safe base64, so these
# bytes are that text on the wire.
SKIP_THOUGHT_SIGNATURE = base64.urlsafe_b64decode("skip_thought_signature_validator")


def to_gemini_contents(messages: Sequence[Message]) -> tuple[str, list[Content]]:
    """OpenAI-format history as ``(system_instruction, contents)`` for the Gemini API.

    System messages are joined into the system instruction; consecutive contents of one
    role are merged (so the results of parallel calls travel in one user turn); a tool
    result is named after the assistant's call it answers. Messages left with no parts are
    dropped."""
    system: list[str] = []
    contents: list[Content] = []
    names: dict[str, str] = {}  # the function name of each tool call, by its id
    for message in messages:
        if message.get("role") == "system":
            text = text_of(message.get("content"))
            if text:
                system.append(text)
            continue
        role, parts = _parts_of(message, names)
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return "\n\n".join(system), contents


def _parts_of(message: Message, names: dict[str, str]) -> tuple[str, list[Part]]:
    """The Gemini role and parts of one non-system OpenAI-format message."""
    role = message.get("role")
    if role == "tool":
        call_id = str(message.get("tool_call_id") or "")
        if call_id not in names:
            raise ModelError(
                f"cannot send the result of tool call {call_id!r} to Gemini: no assistant "
                "turn before it made that call"
            )
        answer = {"id": call_id, "name": names[call_id], "response": _response(message)}
        return "user", [{"function_response": answer}]
    parts: list[Part] = []
    text = text_of(message.get("content"))
    if text:
        parts.append({"text": text})
    if role == "assistant":
        for call in message.get("tool_calls") or []:
            names[str(call.get("id") or "")] = call["function"]["name"]
            parts.append(_function_call_part(call))
        return "model", parts
    if role == "user":
        return "user", parts
    raise ModelError(f"cannot send a message with role {role!r} to Gemini")


def _function_call_part(call: dict[str, Any]) -> Part:
    arguments = arguments_of(call)  # Gemini needs an object
    function = call["function"]
    asked: dict[str, Any] = {"name": function["name"], "args": arguments}
    if call.get("id"):
        asked["id"] = call["id"]
    return {"function_call": asked, "thought_signature": SKIP_THOUGHT_SIGNATURE}


def _response(message: Message) -> dict[str, Any]:
    """A tool result as Gemini's ``response`` object: the result itself if it is a JSON
    object, else ``{"output": ...}`` with the JSON value or the text."""
    text = text_of(message.get("content"))
    try:
        value = json.loads(text)
    except ValueError:
        return {"output": text}
    return value if isinstance(value, dict) else {"output": value}


def to_gemini_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The ``tools`` of a Gemini request: one tool of every function declaration, each
    schema passed through as it is written (``parameters_json_schema``)."""
    declarations = [
        {"name": tool.name, "description": tool.description, "parameters_json_schema": schema}
        if (schema := tool.parameters)
        else {"name": tool.name, "description": tool.description}
        for tool in tools
    ]
    return [{"function_declarations": declarations}] if declarations else []


class BlockedPrompt(Exception):
    """Gemini refused the prompt itself (``promptFeedback.blockReason``): the same prompt
    is refused again."""


def _usage(reported: types.GenerateContentResponseUsageMetadata) -> Usage:
    """The usage a stream reported: the prompt and what tools put in it; the reply and the
    thinking that went into it, which is priced as output."""
    return Usage(
        input_tokens=(reported.prompt_token_count or 0)
        + (reported.tool_use_prompt_token_count or 0),
        output_tokens=(reported.candidates_token_count or 0) + (reported.thoughts_token_count or 0),
    )


def _value(enum: object) -> str:
    """The name the API gave an enum value (``SAFETY``), whatever the SDK made of it."""
    return str(getattr(enum, "value", enum))


class StreamedTurn:
    """A Gemini stream put back together, chunk by chunk, as the assistant turn it streams:
    the first candidate's text parts (thoughts left out) joined, each ``function_call``
    part a tool call, the usage from the last chunk that reports it (each is the total so
    far); complete once the candidate has a ``finishReason``. Text pieces go to ``on_text``
    as they come; a prompt Gemini blocks is ``BlockedPrompt`` at once."""

    def __init__(self, on_text: TextSink, model: str) -> None:
        self._on_text = on_text
        self._model = model
        self._text: list[str] = []
        self._calls: list[types.FunctionCall] = []
        self._usage = Usage()
        self._finished = False

    def add(self, chunk: types.GenerateContentResponse) -> None:
        feedback = chunk.prompt_feedback
        if feedback is not None and feedback.block_reason is not None:
            why = feedback.block_reason_message or "no reason given"
            raise BlockedPrompt(f"{_value(feedback.block_reason)}: {why}")
        if chunk.usage_metadata is not None:
            self._usage = _usage(chunk.usage_metadata)
        for candidate in chunk.candidates or ():
            if candidate.index:  # only the first candidate is asked for
                continue
            content = candidate.content
            for part in (content.parts if content is not None else None) or ():
                if part.thought:
                    continue
                if part.function_call is not None:
                    self._calls.append(part.function_call)
                elif part.text:
                    self._text.append(part.text)
                    self._on_text(part.text)
            if candidate.finish_reason is not None:
                self._finished = True

    def response(self) -> ModelResponse:
        """The turn streamed, once it has finished, as a plain OpenAI-format assistant
        message with its usage (``model``: the name that was requested). A call Gemini
        gave no id gets one, ``call_<n>``, unique in the turn."""
        if not self._finished:
            raise IncompleteStream("the stream ended without a finishReason")
        message: Message = {"role": "assistant", "content": "".join(self._text) or None}
        taken = {call.id for call in self._calls if call.id}
        fresh = (f"call_{n}" for n in itertools.count(1) if f"call_{n}" not in taken)
        calls = [
            {
                "id": call.id or next(fresh),
                "type": "function",
                "function": {"name": call.name or "", "arguments": json.dumps(call.args or {})},
            }
            for call in self._calls
        ]
        if calls:
            message["tool_calls"] = calls
        return ModelResponse(message=message, usage=self._usage, model=self._model)


def _http_status(exc: genai_errors.APIError) -> int | None:
    """The HTTP status of the response an ``APIError`` came of: an error status, or the
    200 of a stream that then sent an error in it."""
    response = getattr(exc, "response", None)
    for name in ("status", "status_code"):  # aiohttp's, then httpx's and the SDK's own
        status = getattr(response, name, None)
        if isinstance(status, int):
            return status
    return None


def _httpx(name: str) -> tuple[type[Exception], ...]:
    """httpx's exception class ``name``, and httpx2's if it is loaded: the SDK's client is
    on aiohttp here, but one given an httpx (or httpx2) client raises theirs."""
    modules = (httpx, sys.modules.get("httpx2"))
    return tuple(getattr(module, name) for module in modules if module is not None)


def _timeouts() -> tuple[type[Exception], ...]:
    """Whatever says a wait ran out: ours and aiohttp's are ``TimeoutError``."""
    return (TimeoutError, *_httpx("TimeoutException"))


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP clients' own errors the SDK lets through (a connection refused or lost)."""
    return (aiohttp.ClientError, *_httpx("TransportError"))


def gemini_error(exc: Exception, name: str, timeout_s: float) -> ModelError:
    """A ``ModelError`` naming the HTTP status and the provider's message, from what a
    Gemini call raised, marked ``transient`` or not (reference §10), as ``model_error``
    does for the other SDKs. An error Gemini sends in the stream carries a code of its
    own: transient unless it is a 4xx that says the request is wrong."""
    if isinstance(exc, genai_errors.APIError):
        status = _http_status(exc)
        code = exc.code if isinstance(exc.code, int) else status
        detail = exc.message or str(exc)
        if status is None or status >= 400:
            return ModelError(
                f"{name} failed with HTTP {code}: {detail}",
                status=code,
                transient=transient_status(code),
            )
        permanent = code is not None and 400 <= code <= 499 and not transient_status(code)
        return ModelError(
            f"{name} failed mid-stream ({exc.status or code or 'unknown error'}): {detail}",
            transient=not permanent,
        )
    if isinstance(exc, BlockedPrompt):
        return ModelError(f"{name} blocked the prompt: {exc}")
    if isinstance(exc, IncompleteStream):
        return ModelError(f"{name} ended its reply too soon: {exc}", transient=True)
    if not_connected(exc) or isinstance(exc, _httpx("ConnectError")):
        return ModelError(f"{name} could not be reached: {exc}", transient=True)
    if isinstance(exc, _timeouts()):
        return ModelError(f"{name} timed out after {timeout_s:g}s", transient=True)
    if isinstance(exc, _transport_errors()):
        return ModelError(
            f"{name} broke off its reply: {exc or type(exc).__name__}", transient=True
        )
    return ModelError(f"{name} failed: {exc}")


class GeminiModel(ProviderModel[genai.Client]):
    """A Gemini model reached through the Gemini API (or a server that speaks it, at
    ``GEMINI_BASE_URL``). An injected ``client`` is a ``genai.Client``, left open."""

    provider = "gemini"
    key_vars = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    base_var = "GEMINI_BASE_URL"

    def _new_client(
        self, base_url: str | None, api_key: str | None, max_retries: int
    ) -> genai.Client:
        api_key, resolved_base = self._credentials(base_url, api_key)
        # The key the environment names, in tether's order (the SDK's own prefers Google's).
        key = api_key or next(os.environ[var] for var in self.key_vars if os.environ.get(var))
        options = types.HttpOptions(
            base_url=resolved_base,
            retry_options=types.HttpRetryOptions(attempts=max_retries + 1),
        )
        return genai.Client(api_key=key, vertexai=False, http_options=options)

    async def _close_client(self) -> None:
        self._client.close()
        await self._client.aio.aclose()

    def _failures(self) -> tuple[type[Exception], ...]:
        return (
            genai_errors.APIError,
            genai_errors.UnknownApiResponseError,
            BlockedPrompt,
            IncompleteStream,
            *_timeouts(),
            *_transport_errors(),
        )

    def _model_error(self, exc: Exception) -> ModelError:
        return gemini_error(exc, self.name, self.timeout_s)

    async def _call(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        system, contents = to_gemini_contents(messages)
        # tether runs the tools: the SDK must not call any itself.
        config: dict[str, Any] = {"automatic_function_calling": {"disable": True}}
        if system:
            config["system_instruction"] = system
        if tools:
            config["tools"] = to_gemini_tools(tools)
        stream = await self._client.aio.models.generate_content_stream(
            model=self.model,
            contents=cast(Any, contents),
            config=cast(Any, config),
        )
        chunks = cast(AsyncGenerator[types.GenerateContentResponse, None], stream)
        assembled = StreamedTurn(on_text, self.model)
        try:
            while True:
                # The request, the SDK's retries of it and the first chunk, then each next.
                async with asyncio.timeout(self.timeout_s):
                    chunk = await anext(chunks, None)
                if chunk is None:
                    break
                assembled.add(chunk)
        finally:
            await chunks.aclose()
        return assembled.response()
