"""Local servers that speak the OpenAI Chat Completions, Anthropic Messages and Gemini
APIs, for tests that drive the real SDK adapters over real HTTP.

Each answers its one POST path (for Gemini, ``/{version}/models/{model}:{method}``) with
scripted replies, in order, and records every request it gets; replies scripted for a
system prompt (``script_for``) answer the requests whose system message (or Gemini's
system instruction) starts with it, so each agent of a tree of sub-agents has its own
order. A reply may succeed, fail with any status in the provider's error shape
(``Reply.failure``: 429, 500, 529, 401, ...), wait for an event before answering, or never
answer (``Reply.hang``: the client's timeout is what ends it). A request with no reply
scripted gets 599, so a test that asks more than it scripted sees it at once.

A successful reply to a request with ``"stream": true`` (for Gemini, to
``:streamGenerateContent``) is sent as each provider streams it (server-sent events, its
text and tool arguments in several pieces, usage in the last chunk or event), from the
same scripted body. Such a reply may break off after its first
piece of text (``Reply.broken``): with an error in the stream, a dropped connection, a
stall that keeps the connection open without sending anything, or a clean end that never
sends the final event.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import uvicorn
from fakestreams import ANTHROPIC_STREAM, GEMINI_STREAM, OPENAI_STREAM, SSE, first_text
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from waiting import poll_until

READY_DEADLINE_S = 10.0

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
# The SDK's API version (``v1`` by default, ``v1beta`` by ``GOOGLE_GENAI_API_VERSION``), the
# model and the method (``streamGenerateContent?alt=sse`` for a streamed call) are in it.
GEMINI_PATH = "/{version}/models/{call}"
STREAMED_GEMINI = ":streamGenerateContent"

# How a streamed reply breaks off after its first piece of text: an error event in the
# provider's format, the connection closed mid-body, no more bytes on an open connection,
# or a body that ends properly but without the stream's final event.
Break = Literal["error", "drop", "stall", "end"]


class DroppedConnection(Exception):
    """Raised in a streamed body to have uvicorn close the connection mid-response."""


class _QuietDrops(logging.Filter):
    """Keeps uvicorn's traceback of a connection dropped on purpose out of the test logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], DroppedConnection))


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """One request the fake server received, and when it arrived (``time.monotonic()``
    of the server's process)."""

    headers: dict[str, str]
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)
    # Where it was sent: for Gemini the model and method are in the path.
    path: str = ""
    query: str = ""


@dataclass(frozen=True, kw_only=True)
class Reply:
    """A scripted answer; with ``hold`` the server waits for the event before answering;
    with ``hang`` it does not answer until the server is reset or stopped; with ``breaks``
    a streamed answer breaks off after its first text (``Reply.broken``); with ``pause_s``
    a streamed answer pauses so long between its events."""

    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None
    hang: bool = False
    # Streamed replies only: a pause before each event after the first (a slow stream).
    pause_s: float = 0.0
    # Streamed replies only: how the stream breaks off, and the error type it then sends.
    breaks: Break | None = None
    error_type: str = "api_error"
    # A failure's message, sent in the error shape of the server's provider.
    failure_message: str | None = None

    @classmethod
    def failure(cls, status: int, message: str, **headers: str) -> Reply:
        """An error in the provider's shape: ``{"error": {"type", "message"}}`` for OpenAI
        and Anthropic, ``{"error": {"code", "message", "status"}}`` for Gemini. The OpenAI
        and Anthropic SDKs' own retries are told not to retry it (``x-should-retry``)
        unless ``headers`` say otherwise, so one reply is one failed call (Gemini's SDK
        retries only as many times as it is told to)."""
        headers = {"x-should-retry": "false", **headers}
        return cls(status=status, failure_message=message, headers=headers)

    @classmethod
    def hung(cls) -> Reply:
        """A request the server never answers: the client's timeout ends it."""
        return cls(hang=True)

    @classmethod
    def broken(cls, body: dict[str, Any], breaks: Break, error_type: str = "api_error") -> Reply:
        """``body`` streamed up to its first piece of text, then broken off as ``breaks``
        says; ``error_type`` is the provider's type of the error sent for ``"error"``
        (``overloaded_error``, ``server_error``, ``invalid_request_error``, ...; Gemini's
        status: ``INTERNAL``, ``UNAVAILABLE``, ``INVALID_ARGUMENT``, ...)."""
        return cls(body=body, breaks=breaks, error_type=error_type)


class FakeLLMServer:
    """A uvicorn server on a loopback port, in a thread, that answers one POST path with
    scripted replies and records every request it gets."""

    def __init__(self, path: str) -> None:
        self.requests: list[Recorded] = []
        self._replies: deque[Reply] = deque()
        # Replies by the start of the request's system message (``script_for``).
        self._by_system: dict[str, deque[Reply]] = {}
        self._lock = threading.Lock()
        # Set to let every hanging request go (at a reset and at stop).
        self._unhang = threading.Event()
        formats = {ANTHROPIC_PATH: ANTHROPIC_STREAM, GEMINI_PATH: GEMINI_STREAM}
        self._format = formats.get(path, OPENAI_STREAM)
        app = FastAPI()
        app.add_api_route(path, self._handle, methods=["POST"])
        app.add_api_route("/healthz", self._healthz, methods=["GET"])
        config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none", http="h11")
        self._server = uvicorn.Server(config)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        # Listening before uvicorn starts: early connections wait in the backlog.
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def script_for(self, system: str, *replies: Reply) -> None:
        """Replies, in order, for the requests whose system message starts with ``system``
        (no other reply answers them; with none left they get 599)."""
        with self._lock:
            self._by_system.setdefault(system, deque()).extend(replies)

    def reset(self) -> None:
        """Forget requests and replies, and let any hanging request go."""
        self._unhang.set()
        with self._lock:
            self.requests.clear()
            self._replies.clear()
            self._by_system.clear()
            self._unhang = threading.Event()

    def count(self) -> int:
        """How many requests arrived so far."""
        with self._lock:
            return len(self.requests)

    def arrivals(self) -> list[float]:
        """When each request arrived so far, in order (``time.monotonic()``)."""
        with self._lock:
            return [request.at for request in self.requests]

    async def _healthz(self) -> dict[str, bool]:
        return {"ok": True}

    async def _handle(self, request: Request) -> Response:
        body = await request.json()
        path, query = request.url.path, request.url.query
        recorded = Recorded(headers=dict(request.headers), body=body, path=path, query=query)
        with self._lock:
            self.requests.append(recorded)
            reply = self._next_reply(body)
            unhang = self._unhang
        if reply is None:
            return JSONResponse({"error": {"message": "no reply scripted"}}, status_code=599)
        if reply.hang:
            await asyncio.to_thread(unhang.wait, READY_DEADLINE_S)
            return JSONResponse({"error": {"message": "hung up"}}, status_code=599)
        if reply.hold is not None:
            await asyncio.to_thread(reply.hold.wait, READY_DEADLINE_S)
        if reply.failure_message is not None:
            failed = self._format.failure(reply.status, reply.failure_message)
            return JSONResponse(failed, status_code=reply.status, headers=reply.headers)
        if (body.get("stream") or path.endswith(STREAMED_GEMINI)) and reply.status == 200:
            events = self._format.events(reply.body, body)
            return StreamingResponse(
                self._stream(events, reply, unhang),
                headers=reply.headers,
                media_type="text/event-stream",
            )
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)

    def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        """The reply for ``body``: from the replies of its system prompt, if scripted, else
        the next in order (the caller holds the lock)."""
        system = system_text(body)
        for prefix, replies in self._by_system.items():
            if system.startswith(prefix):
                return replies.popleft() if replies else None
        return self._replies.popleft() if self._replies else None

    async def _stream(
        self, events: list[SSE], reply: Reply, unhang: threading.Event
    ) -> AsyncIterator[str]:
        """The events of a streamed reply, broken off after the first text if scripted so."""
        cut = first_text(events) + 1 if reply.breaks else len(events)
        for index, event in enumerate(events[:cut]):
            if index and reply.pause_s:
                await asyncio.sleep(reply.pause_s)
            yield event.encode()
        if reply.breaks == "error":
            yield self._format.error(reply.error_type).encode()
        elif reply.breaks == "drop":
            raise DroppedConnection
        elif reply.breaks == "stall":
            await asyncio.to_thread(unhang.wait, READY_DEADLINE_S)

    def start(self) -> None:
        self._thread.start()
        with httpx.Client(timeout=1.0) as client:

            def ready() -> bool:
                if not self._thread.is_alive():
                    raise RuntimeError("fake LLM server stopped before it was ready")
                try:
                    return client.get(f"{self.url}/healthz").status_code == 200
                except httpx.HTTPError:
                    return False

            poll_until(ready, timeout=READY_DEADLINE_S, interval=0.02, what="the fake LLM server")

    def stop(self) -> None:
        self._unhang.set()
        self._server.should_exit = True
        self._thread.join(READY_DEADLINE_S)
        self._sock.close()
        assert not self._thread.is_alive(), "fake LLM server did not stop"


def system_text(body: dict[str, Any]) -> str:
    """The system message of a request's body, in any provider's shape ("" if none)."""
    if "systemInstruction" in body:  # Gemini: a content of text parts
        parts = body["systemInstruction"].get("parts") or []
        return "".join(part.get("text", "") for part in parts)
    system = body.get("system")
    if system is None:
        messages = body.get("messages") or []
        first = messages[0] if messages else {}
        system = first.get("content") if first.get("role") == "system" else ""
    if isinstance(system, list):  # content blocks
        return "".join(block.get("text", "") for block in system if isinstance(block, dict))
    return system if isinstance(system, str) else ""


@contextmanager
def running(path: str) -> Iterator[FakeLLMServer]:
    """A started fake server for ``path`` (``OPENAI_PATH``, ``ANTHROPIC_PATH`` or
    ``GEMINI_PATH``)."""
    server = FakeLLMServer(path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def openai_completion(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    model: str = "gpt-4o-mini-2024-07-18",
) -> dict[str, Any]:
    """A Chat Completions response body."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_message(
    content: list[dict[str, Any]],
    *,
    input_tokens: int = 10,
    output_tokens: int = 5,
    model: str = "claude-haiku-4-5-20251001",
) -> dict[str, Any]:
    """A Messages response body."""
    has_tool_use = any(block["type"] == "tool_use" for block in content)
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if has_tool_use else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def gemini_response(
    parts: list[dict[str, Any]],
    *,
    prompt_tokens: int = 10,
    output_tokens: int = 5,
    thoughts_tokens: int | None = None,
    tool_use_prompt_tokens: int | None = None,
    finish_reason: str = "STOP",
    model: str = "gemini-2.5-flash-001",
) -> dict[str, Any]:
    """A Gemini ``GenerateContentResponse`` body of ``parts`` (``{"text": ...}``,
    ``{"functionCall": {"name", "args"}}``, ``{"text": ..., "thought": True}``)."""
    usage: dict[str, Any] = {
        "promptTokenCount": prompt_tokens,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": prompt_tokens + output_tokens + (thoughts_tokens or 0),
    }
    if thoughts_tokens is not None:
        usage["thoughtsTokenCount"] = thoughts_tokens
    if tool_use_prompt_tokens is not None:
        usage["toolUsePromptTokenCount"] = tool_use_prompt_tokens
    candidate = {
        "content": {"role": "model", "parts": parts},
        "finishReason": finish_reason,
        "index": 0,
    }
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": "resp-1",
    }
