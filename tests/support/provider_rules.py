"""What each provider requires of a conversation it is sent, checked on the requests its fake
server recorded (``fakellm.py``): a history written by several providers in turn must be
valid for each one it is sent to (reference §21).

- Chat Completions: every tool call of an assistant message is answered by a ``tool``
  message right after it, and a ``tool`` message answers a call of that message; each
  call's arguments are a JSON object.
- Messages: user and assistant turns alternate, starting with the user's; no turn is
  empty; each ``tool_result`` of a user turn answers a ``tool_use`` of the assistant turn
  just before it, and every ``tool_use`` is answered there.
- Gemini: ``user`` and ``model`` contents; each ``functionResponse`` of a user content
  answers a ``functionCall`` of the model content just before it, by name (and id when
  the call has one), and every call is answered there.
"""

from __future__ import annotations

import json
from typing import Any


def check_openai(body: dict[str, Any]) -> None:
    """Raise ``AssertionError`` where ``body``'s messages break Chat Completions' rules."""
    messages = body["messages"]
    owed: list[str] = []
    for i, message in enumerate(messages):
        role = message["role"]
        assert role in ("system", "user", "assistant", "tool"), (i, message)
        if role == "tool":
            assert message["tool_call_id"] in owed, (i, "answers no call just before", owed)
            owed.remove(message["tool_call_id"])
            continue
        assert not owed, (i, "calls left unanswered", owed)
        for call in message.get("tool_calls") or ():
            assert isinstance(json.loads(call["function"]["arguments"]), dict), call
            owed.append(call["id"])
    assert not owed, ("calls left unanswered at the end", owed)


def check_anthropic(body: dict[str, Any]) -> None:
    """Raise ``AssertionError`` where ``body``'s messages break the Messages API's rules."""
    turns = body["messages"]
    assert turns and turns[0]["role"] == "user", turns[:1]
    called: set[str] = set()
    for i, turn in enumerate(turns):
        assert turn["role"] == ("user" if i % 2 == 0 else "assistant"), (i, "roles alternate")
        blocks = turn["content"] if isinstance(turn["content"], list) else [turn["content"]]
        assert blocks, (i, "an empty turn")
        kinds = [b.get("type") if isinstance(b, dict) else "text" for b in blocks]
        if turn["role"] == "assistant":
            called = {b["id"] for b in blocks if isinstance(b, dict) and b["type"] == "tool_use"}
            continue
        answered = {
            b["tool_use_id"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "tool_result"
        }
        assert answered == called, (i, "results answer the calls just before", answered, called)
        assert "tool_use" not in kinds, (i, "a user turn holds a tool_use")
        called = set()
    assert not called, ("calls left unanswered at the end", called)


def check_gemini(body: dict[str, Any]) -> None:
    """Raise ``AssertionError`` where ``body``'s contents break the Gemini API's rules."""
    called: list[tuple[str, str | None]] = []
    for i, content in enumerate(body["contents"]):
        role, parts = content["role"], content["parts"]
        assert role in ("user", "model") and parts, (i, content)
        calls = [_part(p, "functionCall", "function_call") for p in parts]
        replies = [_part(p, "functionResponse", "function_response") for p in parts]
        if role == "model":
            assert not called, (i, "calls left unanswered", called)
            called = [(c["name"], c.get("id")) for c in calls if c is not None]
            continue
        answered = [(r["name"], r.get("id")) for r in replies if r is not None]
        for name, call_id in answered:
            match = [c for c in called if c[0] == name and (c[1] is None or c[1] == call_id)]
            assert match, (i, "a response answers no call just before", name, call_id, called)
            called.remove(match[0])
        assert not called, (i, "calls left unanswered", called)
    assert not called, ("calls left unanswered at the end", called)


def _part(part: dict[str, Any], camel: str, snake: str) -> dict[str, Any] | None:
    found = part.get(camel, part.get(snake))
    return found if isinstance(found, dict) else None
