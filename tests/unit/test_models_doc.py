"""docs/models.md's model of one's own, its Python example run as written (reference §21):
it prints what the page says; each run asked the model twice (a lookup, then the answer)
and answered its own order, so the model reacts to the conversation rather than replaying
one; asked again from a run's stored messages it gives the turns it gave; and its
``ModelError`` fails a run ``model_error``. One SQLite file in a temporary folder; the
example runs in this process (its command-line use is tests/acceptance)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import runpy
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, Engine, StopKind
from tether.models import Model

PAGE = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def blocks(kind: str) -> list[str]:
    """The page's fenced blocks of ``kind`` (``python``, ``text``), in order."""
    return re.findall(rf"```{kind}\n(.*?)```\n", PAGE.read_text(encoding="utf-8"), re.S)


@pytest.fixture
def example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    """The page's one Python block saved under the name its first line gives and run as
    ``python order_desk.py`` would, in an empty folder with no ``TETHER_*`` set: its
    namespace and what it printed."""
    for name in [k for k in os.environ if k.startswith("TETHER_")]:
        monkeypatch.delenv(name)
    (code,) = blocks("python")
    path = tmp_path / code.splitlines()[0].removeprefix("# ")
    assert path.name == "order_desk.py"
    path.write_text(code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(path), run_name="__main__")
    return namespace, capsys.readouterr().out


def engine_on_its_database(namespace: dict[str, Any], agent: Agent | None = None) -> Engine:
    """An engine on the example's database, with its model (and its agent, unless given)."""
    agent = agent or namespace["build_agent"]()
    model = namespace["OrderDeskModel"]()
    return Engine(agent=agent, model=model, database_url="sqlite:///./orders.db")


async def stored_runs(engine: Engine) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """Each run of the database, oldest first: its question, messages and event kinds."""
    found = []
    async with engine:
        for run in reversed((await engine.list_runs()).runs):
            view = await engine.get_run(run.id)
            kinds = [event.kind for event in await engine.events(run.id)]
            found.append((run.question, view.messages, kinds))
    return found


def test_the_example_prints_what_the_page_says(example: tuple[dict[str, Any], str]) -> None:
    _, printed = example
    (expected,) = blocks("text")
    assert printed == expected
    assert Path("orders.db").is_file()


def test_each_run_asked_the_model_twice_and_answered_its_own_order(
    example: tuple[dict[str, Any], str],
) -> None:
    namespace, _ = example
    runs = asyncio.run(stored_runs(engine_on_its_database(namespace)))
    assert [question for question, _, _ in runs] == [
        "Where is my order A-1001?",
        "And B-2002?",
        "Is X-9999 on its way?",
    ]
    answers = []
    for question, messages, kinds in runs:
        assert kinds.count("model_turn") == 2, kinds  # asked twice: the lookup, the answer
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        (call,) = messages[2]["tool_calls"]
        asked_for = json.loads(call["function"]["arguments"])["order_id"]
        assert call["function"]["name"] == "lookup_order" and asked_for in question
        assert json.loads(messages[3]["content"])["order_id"] == asked_for
        answer = messages[4]["content"]
        assert asked_for in answer and "tool_calls" not in messages[4]
        answers.append(answer)
    assert answers[0].startswith("Order A-1001 is shipped")
    assert len(set(answers)) == 3  # not a replay: each conversation its own answer


def test_asked_again_from_the_stored_messages_it_gives_the_turns_it_gave(
    example: tuple[dict[str, Any], str],
) -> None:
    """What a resumed run relies on: the model keeps nothing between calls."""
    namespace, _ = example
    agent: Agent = namespace["build_agent"]()
    model: Model = namespace["OrderDeskModel"]()
    runs = asyncio.run(stored_runs(engine_on_its_database(namespace, agent)))

    async def again(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        tools = list(agent.tool_specs)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        return [(await model.request(messages[:i], tools)).message for i in turns]

    for _, messages, _ in runs:
        stored = [m for m in messages if m["role"] == "assistant"]
        assert asyncio.run(again(messages)) == stored


def test_its_model_error_fails_the_run_model_error(example: tuple[dict[str, Any], str]) -> None:
    """An agent without ``lookup_order``: the model raises a permanent ``ModelError``."""
    namespace, _ = example
    bare = Agent(name="no-lookup", system_prompt="You answer questions about orders.")

    async def ask() -> tuple[StopKind, str | None, list[str]]:
        async with engine_on_its_database(namespace, bare) as engine:
            outcome = await engine.ask("dana", "Where is my order A-1001?")
            kinds = [event.kind for event in await engine.events(outcome.run_id)]
            return outcome.kind, outcome.reason, kinds

    kind, reason, kinds = asyncio.run(ask())
    assert (kind, reason) == (StopKind.FAILED, "model_error")
    assert "model_turn" not in kinds
