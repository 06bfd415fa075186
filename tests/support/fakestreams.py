"""A scripted reply body as the provider would stream it, for ``fakellm``'s servers.

A Chat Completions body becomes ``chat.completion.chunk`` events (the text and each tool
call's arguments in pieces, tool calls by ``index``, the usage chunk last when the request
asked for it, then ``[DONE]``); a Messages body becomes ``message_start``,
``content_block_start`` / ``_delta`` / ``_stop`` per block, ``message_delta`` with the
stop reason and output tokens, and ``message_stop``; a Gemini ``GenerateContentResponse``
becomes one response per piece (thoughts first, the text in pieces, each function call
whole, the usage so far in each), then one with an empty text, the ``finishReason`` and
the whole usage. Each provider's error body is here too, for a failed reply and for an
error sent in the middle of a stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Each text and each tool call's arguments is sent in this many pieces (fewer if shorter).
PIECES = 3


@dataclass(frozen=True, kw_only=True)
class SSE:
    """One server-sent event; ``text`` marks an event that carries a piece of the text."""

    data: dict[str, Any] | str
    event: str | None = None
    text: bool = False

    def encode(self) -> str:
        data = self.data if isinstance(self.data, str) else json.dumps(self.data)
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {data}\n\n"


@dataclass(frozen=True, kw_only=True)
class StreamFormat:
    """How one provider streams: a reply body as events (given the request), the event of
    an error in the middle of a stream, by the provider's error type, and the body of a
    failed reply (by its HTTP status and message)."""

    events: Callable[[dict[str, Any], dict[str, Any]], list[SSE]]
    error: Callable[[str], SSE]
    failure: Callable[[int, str], dict[str, Any]]


def pieces(text: str, count: int = PIECES) -> list[str]:
    """``text`` cut into at most ``count`` consecutive pieces (one empty piece if empty)."""
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)] or [text]


def first_text(events: list[SSE]) -> int:
    """The index of the first event that carries text, or 0 if none does."""
    return next((i for i, event in enumerate(events) if event.text), 0)


def _openai_events(body: dict[str, Any], request: dict[str, Any]) -> list[SSE]:
    choice = body["choices"][0]
    message = choice["message"]
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    head = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        data = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return {**data, "usage": None} if include_usage else data

    content = message.get("content")
    events = [SSE(data=chunk({"role": "assistant", "content": "" if content else content}))]
    for piece in pieces(content) if content else []:
        events.append(SSE(data=chunk({"content": piece}), text=True))
    for piece in pieces(message["refusal"]) if message.get("refusal") else []:
        events.append(SSE(data=chunk({"refusal": piece})))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": call["type"]}
        opening["function"] = {"name": function["name"], "arguments": ""}
        events.append(SSE(data=chunk({"tool_calls": [opening]})))
        for piece in pieces(function["arguments"]):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            events.append(SSE(data=chunk(delta)))
    events.append(SSE(data=chunk({}, choice["finish_reason"])))
    if include_usage and body.get("usage"):
        events.append(SSE(data={**head, "choices": [], "usage": body["usage"]}))
    events.append(SSE(data="[DONE]"))
    return events


def _openai_error(error_type: str) -> SSE:
    message = f"the stream failed: {error_type}"
    return SSE(data={"error": {"message": message, "type": error_type, "code": None}})


def _anthropic_events(body: dict[str, Any], request: dict[str, Any]) -> list[SSE]:
    usage = body["usage"]
    # Input tokens come first; output tokens grow as the reply is written, counted at the end.
    started = {**body, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [
        _anthropic("message_start", message=started),
        _anthropic("ping"),
    ]
    for index, block in enumerate(body["content"]):
        opening: dict[str, Any]
        if block["type"] == "text":
            opening = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in pieces(block["text"])]
        else:
            opening = {**block, "input": {}}
            arguments = pieces(json.dumps(block["input"]))
            deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in arguments]
        events.append(_anthropic("content_block_start", index=index, content_block=opening))
        for delta in deltas:
            is_text = delta["type"] == "text_delta"
            events.append(_anthropic("content_block_delta", index=index, delta=delta, text=is_text))
        events.append(_anthropic("content_block_stop", index=index))
    stopped = {"stop_reason": body["stop_reason"], "stop_sequence": None}
    output = {"output_tokens": usage["output_tokens"]}
    events.append(_anthropic("message_delta", delta=stopped, usage=output))
    events.append(_anthropic("message_stop"))
    return events


def _anthropic(kind: str, *, text: bool = False, **fields: Any) -> SSE:
    return SSE(event=kind, data={"type": kind, **fields}, text=text)


def _anthropic_error(error_type: str) -> SSE:
    error = {"type": error_type, "message": f"the stream failed: {error_type}"}
    return _anthropic("error", error=error)


def _failure(status: int, message: str) -> dict[str, Any]:
    """The error body OpenAI and Anthropic both send (the SDKs read ``error.message``)."""
    return {"type": "error", "error": {"type": "api_error", "message": message}}


# Google's canonical status of an HTTP status, as Gemini's errors carry it.
GEMINI_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def gemini_failure(status: int, message: str) -> dict[str, Any]:
    """Gemini's error body: ``{"error": {"code", "message", "status"}}``."""
    name = GEMINI_STATUSES.get(status, "UNKNOWN")
    return {"error": {"code": status, "message": message, "status": name}}


def _gemini_events(body: dict[str, Any], request: dict[str, Any]) -> list[SSE]:
    if not body.get("candidates"):  # a blocked prompt: its feedback, at once
        return [SSE(data=body)]
    candidate = body["candidates"][0]
    usage = body.get("usageMetadata") or {}
    so_far = {"promptTokenCount": usage.get("promptTokenCount", 0)}
    head = {"modelVersion": body.get("modelVersion"), "responseId": body.get("responseId")}

    def chunk(part: dict[str, Any], **done: Any) -> dict[str, Any]:
        content = {"role": "model", "parts": [part]}
        return {"candidates": [{"content": content, "index": 0, **done}], **head}

    events: list[SSE] = []
    for part in candidate["content"]["parts"]:
        if "text" in part and not part.get("thought"):
            for piece in pieces(part["text"]):
                events.append(
                    SSE(data={**chunk({"text": piece}), "usageMetadata": so_far}, text=True)
                )
        else:
            events.append(SSE(data={**chunk(part), "usageMetadata": so_far}))
    finished = chunk({"text": ""}, finishReason=candidate["finishReason"])
    events.append(SSE(data={**finished, "usageMetadata": usage}))
    return events


def _gemini_error(error_type: str) -> SSE:
    codes = {name: code for code, name in GEMINI_STATUSES.items()}
    error = gemini_failure(codes.get(error_type, 500), f"the stream failed: {error_type}")
    error["error"]["status"] = error_type
    return SSE(data=error)


OPENAI_STREAM = StreamFormat(events=_openai_events, error=_openai_error, failure=_failure)
ANTHROPIC_STREAM = StreamFormat(events=_anthropic_events, error=_anthropic_error, failure=_failure)
GEMINI_STREAM = StreamFormat(events=_gemini_events, error=_gemini_error, failure=gemini_failure)
