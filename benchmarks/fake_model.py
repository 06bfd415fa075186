"""A fake OpenAI Chat Completions server for the capacity benchmark, in its own process.

It answers every ``POST /v1/chat/completions`` after ``--latency`` seconds, give or take
``--jitter`` of it (uniformly, so the mean is the latency), as a model that takes that
long would. A model's latency varies; a constant one makes a process's requests march in
step (every answer of a round arrives at once and waits for the others: with the bare
SDK, 200 requests of 1 s each took 1.37 s with the process's core 40 % busy), which no
provider does. The reply is streamed (server-sent events): it calls the read tool
``fetch`` with ``n`` = the assistant turns the request holds so far, until a run has had
``--steps`` - 1 of them; then it answers ``done``. So any number of runs, each of
``--steps`` steps, can be carried by one server without scripting their replies one by
one, and the tether worker goes through the real ``openai`` SDK over HTTP. The replies
are the tests' own (``fakellm.openai_completion``, streamed as ``fakestreams`` streams
them).

It is a plain ``asyncio`` protocol rather than uvicorn: at thousands of requests a
second on two shared cores, the server's own CPU would otherwise be a large part of what
is measured (``capacity.py`` reports its CPU apart all the same). It speaks only what the
SDK sends here: HTTP/1.1 with ``Content-Length`` bodies and keep-alive.

Run: python benchmarks/fake_model.py --port 0 --latency 1.0 --jitter 0.5 --steps 30
(prints ``listening PORT`` once it accepts connections; ``GET /stats`` answers the
requests seen so far).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from fakellm import openai_completion
from fakestreams import OPENAI_STREAM

_STATUS = b"HTTP/1.1 200 OK\r\n"


def _sse(body: dict[str, Any]) -> bytes:
    """The whole streamed reply of ``body``, as one HTTP response."""
    request = {"stream": True, "stream_options": {"include_usage": True}}
    events = "".join(e.encode() for e in OPENAI_STREAM.events(body, request)).encode()
    head = (
        _STATUS + b"content-type: text/event-stream\r\n"
        b"content-length: " + str(len(events)).encode() + b"\r\n\r\n"
    )
    return head + events


class Replies:
    """Every reply, built once: turn ``n`` < steps - 1 calls ``fetch(n)``, then the answer."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._calls = [
            _sse(
                openai_completion(
                    tool_calls=[
                        {
                            "id": f"call_{n}",
                            "type": "function",
                            "function": {"name": "fetch", "arguments": json.dumps({"n": n})},
                        }
                    ],
                    prompt_tokens=100,
                    completion_tokens=10,
                )
            )
            for n in range(max(0, steps - 1))
        ]
        self._answer = _sse(
            openai_completion(content="done", prompt_tokens=100, completion_tokens=10)
        )

    def for_turn(self, turn: int) -> bytes:
        return self._calls[turn] if turn < len(self._calls) else self._answer


class Counts:
    requests = 0
    connections = 0


def _turns(body: bytes) -> int:
    """How many assistant turns the request's messages hold (a substring count: the
    messages are the SDK's JSON, so each assistant message has this exact member)."""
    return body.count(b'"role":"assistant"') + body.count(b'"role": "assistant"')


class ModelProtocol(asyncio.Protocol):
    """One keep-alive connection: requests in order, each answered after the latency."""

    def __init__(self, replies: Replies, latency: float, jitter: float) -> None:
        self.replies = replies
        self.latency = latency
        self.jitter = jitter
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        Counts.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self._answer(head.split(" ", 2)[:2], body)

    def _answer(self, request_line: list[str], body: bytes) -> None:
        loop = asyncio.get_running_loop()
        if request_line == ["GET", "/stats"]:
            data = json.dumps({"requests": Counts.requests, "connections": Counts.connections})
            self._send(
                _STATUS + b"content-type: application/json\r\ncontent-length: "
                + str(len(data)).encode() + b"\r\n\r\n" + data.encode()
            )  # fmt: skip
            return
        Counts.requests += 1
        reply = self.replies.for_turn(_turns(body))
        spread = self.latency * self.jitter
        loop.call_later(self.latency + random.uniform(-spread, spread), self._send, reply)

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(port: int, latency: float, jitter: float, steps: int) -> None:
    replies = Replies(steps)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: ModelProtocol(replies, latency, jitter), "127.0.0.1", port, backlog=8192
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency, args.jitter, args.steps))


if __name__ == "__main__":
    main()
