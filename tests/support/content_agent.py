"""The agent of the test that no content leaves the database (``test_no_content.py``,
reference §20): every kind of content it handles carries a marker of its own, so a test
can look for each in what a process wrote outside the database.

One run of it (asked ``MARKS["question"]``): the model's first call fails (transiently,
its error's message marked), then it asks ``find`` (arguments and result marked) and
``explode`` (a read that raises, its message marked), then ``publish``, a write a human
confirms (its preview marked), which the test declines with a marked reason; the model
then answers (marked).

``--agent content_agent:agent``.
"""

from __future__ import annotations

from typing import Any

from tether import Agent, Scope, ScriptedModel, tool
from tether.errors import ModelError
from tether.models.base import Message, Model, ModelResponse, ToolSpec

MARKS = {
    kind: f"zq{kind}mark"
    for kind in (
        "question",
        "arguments",
        "result",
        "preview",
        "reason",
        "answer",
        "toolerror",
        "modelerror",
    )
}


@tool
def find(query: str) -> dict[str, Any]:
    """A read whose result is content."""
    return {"query_chars": len(query), "found": MARKS["result"]}


@tool
def explode(what: str) -> dict[str, Any]:
    """A read that raises an exception no tool declares, its message content."""
    raise RuntimeError(f"{MARKS['toolerror']} while exploding {what}")


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"shown": MARKS["preview"], "chars": len(args.text)}


@tool(effect="write", needs_confirmation=True, preview=_preview, dedupes=True)
def publish(text: str) -> dict[str, Any]:
    """A write a human confirms (the test declines it, so it never runs)."""
    return {"published": len(text)}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [_call("find", query=MARKS["arguments"]), _call("explode", what="x")]},
    {"tool_calls": [_call("publish", text="a text")]},
    {"content": MARKS["answer"]},
]


class FailsFirst(Model):
    """``SCRIPT``, after a first call that fails transiently with a marked message (once
    per process: the test's run is carried by one process)."""

    name = "scripted:content"

    def __init__(self) -> None:
        self.script = ScriptedModel(SCRIPT, model="content")
        self.failed = False

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        if not self.failed:
            self.failed = True
            raise ModelError(f"provider said: {MARKS['modelerror']}", status=503, transient=True)
        return await self.script.request(messages, tools)


async def _scope(user_id: str) -> Scope:
    return Scope(user_id=user_id)


def agent() -> Agent:
    """The agent, playing ``SCRIPT`` through ``FailsFirst``."""
    return Agent(
        name="content",
        system_prompt="You are a test agent.",
        tools=(find, explode, publish),
        resolve_scope=_scope,
        default_model=FailsFirst,
    )
