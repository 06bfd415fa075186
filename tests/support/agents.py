"""The agents under test: tools that act on the test downstream (``downstream.py``), so
tests can count external effects per idempotency key, their scripted turns, and the agents
built of them. Imported by tests and by the ``tether`` subprocesses they start
(``--agent agents:agent``, ``--agent agents:fault_agent``).

- ``agent()``: reads and writes of every kind (``lookup``; ``record``, which the downstream
  deduplicates; ``write_once``, reconciled by key; ``blind_write``, neither; ``send``, which
  a human confirms, with a preview, a guard and a permission; ``tally`` and ``stamp``,
  concurrent writes, deduplicated and reconciled), playing ``KIT_SCRIPT``;
- ``fault_agent()``: the same and a slow read (``nap``) and a slow re-check
  (``careful_send``), each run playing the script its question names;
- ``ship``: a write a human confirms whose arguments are of every kind an edit form shows;
- ``four_eyes_agent()``: ``send`` and ``transfer``, a write that someone other than the
  run's owner must decide (``approvers="others"``), playing ``KIT_SCRIPT`` (``transfer``).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Literal

import downstream

from tether import Agent, GuardResult, Scope, ScriptedModel, ToolContext, tool
from tether.models.base import Message, Model, ModelResponse, ToolSpec


@tool
def lookup(query: str) -> dict[str, Any]:
    """Look something up (a read); ``lookup_ms`` in the world makes it take that long."""
    work_ms = int(downstream.world("lookup_ms", "0"))
    if work_ms:
        # Marks, outside the downstream's database, that the work has begun: a test may
        # stop the process from here on without catching it inside a SQLite lock.
        Path(os.environ["KIT_EFFECTS_DB"] + ".working").touch()
        time.sleep(work_ms / 1000)  # simulated work, so elapsed-time budgets are exercised
    return {
        "query": query,
        "answer": f"about {query}",
        "pad": "x" * int(downstream.world("pad", "0")),
    }


@tool(effect="write", dedupes=True)
def record(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Record an item downstream; the downstream deduplicates by idempotency key."""
    return downstream.apply(ctx, "record", item, dedupe=True)


@tool(effect="write", reconcile=downstream.find)
def write_once(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Write downstream without deduplication; reconciled by looking the key up."""
    return downstream.apply(ctx, "write_once", item, dedupe=False)


@tool(effect="write", accept_unreconcilable=True)
def blind_write(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write that can be neither reconciled nor re-issued."""
    return downstream.apply(ctx, "blind_write", item, dedupe=False)


@tool(effect="write", dedupes=True, concurrent=True)
def tally(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write that commutes with the others (runs beside them); the downstream
    deduplicates by idempotency key."""
    return downstream.apply(ctx, "tally", item, dedupe=True)


@tool(effect="write", reconcile=downstream.find, concurrent=True)
def stamp(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write that commutes with the others, reconciled by looking its key up."""
    return downstream.apply(ctx, "stamp", item, dedupe=False)


def _preview(args: Any, scope: Scope) -> dict[str, Any]:
    return {"item": args.item, "price": downstream.world("price", "100")}


def _guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    if downstream.world("hold") == "1":
        return GuardResult.refuse("the account is on hold")
    return GuardResult.allow()


def _permitted(args: Any, scope: Scope) -> bool:
    return bool(scope.permissions.get("can_send", True))


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    reconcile=downstream.find,
    preview=_preview,
    guard=_guard,
    permitted=_permitted,
)
def send(ctx: ToolContext, item: str) -> dict[str, Any]:
    """Send an item: a write a human must confirm."""
    return downstream.apply(ctx, "send", item, dedupe=True)


async def resolve(user_id: str) -> Scope:
    """Scope from the downstream's world table: ``perm:USER`` = "0" revokes sending."""
    return Scope(
        user_id=user_id,
        permissions={"can_send": downstream.world(f"perm:{user_id}", "1") == "1"},
        approvers=frozenset({"boss"}),
    )


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One tool call of a scripted turn."""
    return {"name": name, "arguments": arguments}


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # read; a deduplicating write with a read in the same turn; a confirmed send; answer.
    "standard": [
        {"tool_calls": [call("lookup", query="x")]},
        {"tool_calls": [call("record", item="a"), call("lookup", query="y")]},
        {"tool_calls": [call("send", item="b")]},
        {"content": "done"},
    ],
    "write_once": [
        {"tool_calls": [call("write_once", item="w")]},
        {"content": "done"},
    ],
    "blind": [
        {"tool_calls": [call("blind_write", item="z")]},
        {"content": "done"},
    ],
    "send": [
        {"tool_calls": [call("send", item="b")]},
        {"content": "done"},
    ],
    "answer": [{"content": "forty-two"}],
    # two sends in one turn, a read between them: one suspension for both (reference §15).
    "two_sends": [
        {"tool_calls": [call("send", item="b"), call("lookup", query="x"), call("send", item="c")]},
        {"content": "done"},
    ],
    # two concurrent writes and a read in one turn: they run together.
    "concurrent": [
        {
            "tool_calls": [
                call("tally", item="t"),
                call("lookup", query="q"),
                call("stamp", item="s"),
            ]
        },
        {"content": "done"},
    ],
    # no confirmation: a read, a deduplicating write, an answer.
    "work": [
        {"tool_calls": [call("lookup", query="x")]},
        {"tool_calls": [call("record", item="a")]},
        {"content": "done"},
    ],
    # text streamed as it is written (reference §16): a turn of text and a read, then a
    # long answer; the pace is ``PACES``'.
    "streamed": [
        {
            "content": "Let me look that up for you, a few letters at a time.",
            "tool_calls": [call("lookup", query="x")],
        },
        {"content": "Here is the answer, written slowly: " + "all is well. " * 12},
    ],
    # ten steps of text streamed (nine with a read, then the answer), each stored at once
    # after its last piece: what a watcher in another process must get whole, in order.
    "streamed_steps": [
        *(
            {
                "content": f"Step {i}: let me look that up, a few letters at a time.",
                "tool_calls": [call("lookup", query=f"q{i}")],
            }
            for i in range(1, 10)
        ),
        {"content": "Here is the answer: I can send you a quote today."},
    ],
    # text streamed, then a confirmed send in the same turn: the run suspends once its
    # text is written (what the inbox's run page shows live).
    "streamed_send": [
        {
            "content": "I will send it once you agree; " + "writing it out slowly. " * 4,
            "tool_calls": [call("send", item="b")],
        },
        {"content": "done"},
    ],
}

# How the scripts of ``SCRIPTS`` named here stream their text: pieces of ``chunk_chars``
# code points, one every ``KIT_STREAM_DELAY_S`` seconds (0.02 unless set).
PACES: dict[str, int] = {"streamed": 4, "streamed_steps": 4, "streamed_send": 4}


def script(name: str | None = None) -> ScriptedModel:
    name = name or os.environ.get("KIT_SCRIPT", "standard")
    pace = None
    if name in PACES:
        delay = float(os.environ.get("KIT_STREAM_DELAY_S", "0.02"))
        pace = {"chunk_chars": PACES[name], "delay_s": delay}
    return ScriptedModel(SCRIPTS[name], stream=pace)


def agent() -> Agent:
    """The test agent; its scripted model is chosen by ``KIT_SCRIPT``."""
    return Agent(
        name="kit",
        system_prompt="You are a test agent.",
        tools=(lookup, record, write_once, blind_write, send, tally, stamp),
        resolve_scope=resolve,
        default_model=script,
    )


# -- an edit form of every kind of field (tests/integration/test_web.py) ---------------------


def _ship_preview(args: Any, scope: Any) -> dict[str, Any]:
    return {"sku": args.sku, "quantity": args.quantity, "cost": args.quantity * args.weight}


@tool(effect="write", needs_confirmation=True, dedupes=True, preview=_ship_preview)
def ship(
    sku: str,
    quantity: int,
    rush: bool = False,
    speed: Literal["ground", "air"] = "ground",
    weight: float = 1.5,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Ship an order (a write a human confirms); its downstream deduplicates by key."""
    return {"shipped": sku, "quantity": quantity, "rush": rush, "speed": speed}


# -- fault trials (tests/acceptance/test_faults.py) ------------------------------------------


@tool
def nap(ctx: ToolContext, ms: int) -> dict[str, Any]:
    """A read that takes ``ms`` milliseconds in a plain function (so it runs in a thread);
    each execution is recorded downstream first, so a test can count how often it ran."""
    downstream.note_execution(ctx.idempotency_key, "nap", str(ms))
    time.sleep(ms / 1000)  # the slow work itself
    return {"slept_ms": ms}


async def _careful_guard(args: Any, scope: Scope, ctx: ToolContext) -> GuardResult:
    """``send``'s guard, slow (``careful_guard_ms`` in the world) when it re-checks a call
    a human approved: an approval whose re-checks outlast the heartbeat timeout."""
    if ctx.confirmed:
        await asyncio.sleep(int(downstream.world("careful_guard_ms", "0")) / 1000)
    return _guard(args, scope, ctx)


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    reconcile=downstream.find,
    preview=_preview,
    guard=_careful_guard,
    permitted=_permitted,
)
def careful_send(ctx: ToolContext, item: str) -> dict[str, Any]:
    """``send`` with a slow re-check after approval."""
    return downstream.apply(ctx, "careful_send", item, dedupe=True)


def _naps(count: int, ms: int) -> list[dict[str, Any]]:
    return [{"tool_calls": [call("nap", ms=ms)]} for _ in range(count)]


FAULT_SCRIPTS: dict[str, list[dict[str, Any]]] = {
    **SCRIPTS,
    # several steps, each a short nap, then a deduplicating write and the answer: a run
    # that is in progress for a few seconds.
    "steps": [*_naps(6, 300), {"tool_calls": [call("record", item="s")]}, {"content": "done"}],
    # one plain-function read far longer than the trials' heartbeat timeouts.
    "slow": [*_naps(1, 6000), {"content": "done"}],
    "careful_send": [{"tool_calls": [call("careful_send", item="c")]}, {"content": "done"}],
}


class ByQuestion(Model):
    """Plays the script the run's question names (``"script:NAME ..."``, else
    ``KIT_SCRIPT``), so one process can carry runs of different scripts."""

    name = "scripted:by-question"

    def __init__(self) -> None:
        self._models: dict[str, ScriptedModel] = {}

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        question = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        first = question.split(maxsplit=1)[0] if question.strip() else ""
        name = (
            first.removeprefix("script:")
            if first.startswith("script:")
            else os.environ.get("KIT_SCRIPT", "standard")
        )
        if name not in self._models:
            self._models[name] = ScriptedModel(FAULT_SCRIPTS[name])
        return await self._models[name].request(messages, tools)


def fault_agent() -> Agent:
    """The test agent with ``nap`` and ``careful_send``; each run's question picks its
    script."""
    return Agent(
        name="kit-faults",
        system_prompt="You are a test agent.",
        tools=(lookup, record, write_once, blind_write, send, nap, careful_send),
        resolve_scope=resolve,
        default_model=ByQuestion,
    )


# -- four eyes (tests/integration/test_four_eyes.py) -----------------------------------------


@tool(
    effect="write",
    needs_confirmation=True,
    dedupes=True,
    reconcile=downstream.find,
    preview=_preview,
    approvers="others",
)
def transfer(ctx: ToolContext, item: str) -> dict[str, Any]:
    """A write someone other than the run's owner must decide (four eyes)."""
    return downstream.apply(ctx, "transfer", item, dedupe=True)


FOUR_EYES_SCRIPTS: dict[str, list[dict[str, Any]]] = {
    **SCRIPTS,
    "transfer": [{"tool_calls": [call("transfer", item="b")]}, {"content": "done"}],
}


def four_eyes_script(name: str | None = None) -> ScriptedModel:
    return ScriptedModel(FOUR_EYES_SCRIPTS[name or os.environ.get("KIT_SCRIPT", "transfer")])


def four_eyes_agent() -> Agent:
    """The test agent's ``send`` and the four-eyes ``transfer``; its scope's approver is
    ``boss``."""
    return Agent(
        name="kit-four-eyes",
        system_prompt="You are a test agent.",
        tools=(lookup, send, transfer),
        resolve_scope=resolve,
        default_model=four_eyes_script,
    )
