"""A tree of sub-agents whose children wait for a person, for the inbox's tests: the root
``planner`` hands one task to ``clerk`` and one to ``researcher``, which reads and hands a
task of its own to ``courier``; the clerk and the courier each ask for a ``send`` (the
test agent's, which a human confirms). ``script()`` plays each agent's turns; ``grow()``
starts a root and carries it and each of its descendants until every run of the tree has
stopped: the clerk and the courier suspended on their ``send``, the researcher and the
root waiting for them. And ``forms()``: the forms of a page as it shows them."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import agents

from tether import Agent, Engine, ScriptedModel, StopKind

CLERK_PROMPT = "You are the clerk."
COURIER_PROMPT = "You are the courier."
RESEARCHER_PROMPT = "You are the researcher."
QUESTION = "Plan the order"


def planner() -> Agent:
    """The root agent, its two sub-agents, and the researcher's own."""
    clerk, courier = (
        Agent(name=name, system_prompt=prompt, tools=(agents.send,), resolve_scope=agents.resolve)
        for name, prompt in (("clerk", CLERK_PROMPT), ("courier", COURIER_PROMPT))
    )
    researcher = Agent(
        name="researcher",
        system_prompt=RESEARCHER_PROMPT,
        tools=(agents.lookup, courier.as_tool()),
        resolve_scope=agents.resolve,
    )
    return Agent(
        name="planner",
        system_prompt="You plan.",
        tools=(clerk.as_tool(), researcher.as_tool(), agents.lookup),
        resolve_scope=agents.resolve,
    )


def script(item: str = "b") -> ScriptedModel:
    """The root delegates twice, the researcher reads then delegates; the clerk sends
    ``item``, the courier ``c`` (calls a human confirms); each answers once its calls have
    results."""
    call = agents.call

    def sending(what: str) -> dict[str, Any]:
        return {"turns": [{"tool_calls": [call("send", item=what)]}], "final": f"sent {what}"}

    return ScriptedModel(
        [
            {
                "tool_calls": [
                    call("clerk", task=f"send {item}"),
                    call("researcher", task="look into c"),
                ]
            },
            {"content": "planned"},
        ],
        by_system={
            CLERK_PROMPT: sending(item),
            COURIER_PROMPT: sending("c"),
            RESEARCHER_PROMPT: {
                "turns": [
                    {"tool_calls": [call("lookup", query="c"), call("courier", task="send c")]}
                ],
                "final": "researched",
            },
        },
    )


@dataclass(frozen=True)
class Tree:
    """The runs of a grown tree, by their place in it."""

    root: str
    clerk: str  # the root's clerk, suspended
    researcher: str  # waiting for its courier
    courier: str  # the researcher's courier, suspended


async def carry(engine: Engine, run_id: str) -> None:
    """Carry each child of ``run_id`` to its stop, and the children of those that wait."""
    for child in engine.runner.store.children(run_id):
        outcome = await engine.run_until_stop(child.id)
        if outcome.kind is StopKind.WAITING:
            await carry(engine, child.id)


async def grow(engine: Engine, user: str = "dana", question: str = QUESTION) -> Tree:
    """``user``'s tree of ``planner`` (the engine's agent) with every run stopped."""
    outcome = await engine.ask(user, question)
    assert outcome.kind is StopKind.WAITING, outcome
    await carry(engine, outcome.run_id)
    store = engine.runner.store
    clerk, researcher = (run.id for run in store.children(outcome.run_id))
    [courier] = (run.id for run in store.children(researcher))
    return Tree(root=outcome.run_id, clerk=clerk, researcher=researcher, courier=courier)


@dataclass(frozen=True)
class Form:
    """A form as a page shows it: where it posts, its class, and the values it would post
    as shown (its inputs and text areas; not its buttons)."""

    action: str
    cls: str
    values: dict[str, str]


class _Forms(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[Form] = []
        self._area: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {key: value or "" for key, value in attrs}
        if tag == "form":
            self.found.append(Form(named.get("action", ""), named.get("class", ""), {}))
        elif not self.found or "name" not in named:
            return
        elif tag == "input" and named.get("type") not in ("checkbox", "radio", "submit"):
            self.found[-1].values[named["name"]] = named.get("value", "")
        elif tag == "input" and "checked" in named:
            self.found[-1].values[named["name"]] = named.get("value", "on")
        elif tag == "textarea":
            self._area = named["name"]
            self.found[-1].values[self._area] = ""

    def handle_data(self, data: str) -> None:
        if self._area is not None:
            self.found[-1].values[self._area] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._area = None


def forms(page: str, action: str | None = None) -> list[Form]:
    """The forms of ``page`` in page order (those posting to ``action`` if given)."""
    parser = _Forms()
    parser.feed(page)
    return [f for f in parser.found if action is None or f.action == action]
