"""docs/reference.md §17, the Python API, is kept true by the code: each table of the
``Engine``, its two sides and the ``Worker`` names exactly their public members, and the
table of what the Engine returns names exactly each record's fields."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import tether
from tether import results
from tether.agent import Agent
from tether.engine import Engine, Operator, WebSide
from tether.models import ScriptedModel
from tether.worker import Worker

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
_CODE = re.compile(r"`([^`]+)`")
_NAME = re.compile(r"(?:\w+\.)?(\w+)(?:\(.*)?$")


def python_api() -> str:
    text = REFERENCE.read_text(encoding="utf-8")
    start = text.index("\n## 17. The Python API")
    end = text.find("\n## 18.", start)
    return text[start : end if end != -1 else len(text)]


def subsection_rows(heading: str) -> list[list[str]]:
    """The rows of the table under ``### heading`` of §17, each as its cells."""
    text = python_api()
    marker = f"\n### {heading}\n"
    assert marker in text, f"reference §17 has no subsection '### {heading}'"
    body = text.split(marker, 1)[1].split("\n### ", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def documented(heading: str, owner: str) -> set[str]:
    """The member names a table documents: each code span of a row's first cell, without
    its arguments; the constructor's row (``Owner(...)``) names none."""
    names: set[str] = set()
    for row in subsection_rows(heading):
        for code in _CODE.findall(row[0]):
            found = _NAME.match(code)
            assert found is not None, f"{heading}: not a member: {code}"
            if found.group(1) != owner:
                names.add(found.group(1))
    return names


def public(cls: type, instance: object | None = None) -> set[str]:
    names = {name for name in dir(cls) if not name.startswith("_")}
    if instance is not None:
        names |= {name for name in vars(instance) if not name.startswith("_")}
    return names


def an_engine(tmp_path: Path) -> Engine:
    """An engine on a SQLite file nobody opens: the constructor does no I/O."""
    agent = Agent(name="reference", system_prompt="-")
    return Engine(
        agent=agent, model=ScriptedModel([]), database_url=f"sqlite:///{tmp_path / 'x.db'}"
    )


def test_the_engine_table_names_exactly_the_engines_public_members(tmp_path: Path) -> None:
    engine = an_engine(tmp_path)
    try:
        assert documented("`Engine`", "Engine") == public(Engine, engine)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("heading", "cls"),
    [("`Engine.web`", WebSide), ("`Engine.operator`", Operator), ("`Worker`", Worker)],
)
def test_each_side_and_the_worker_are_documented_member_by_member(heading: str, cls: type) -> None:
    assert documented(heading, cls.__name__) == public(cls)


def test_the_engine_has_about_25_methods_and_its_sides_hold_the_rest(tmp_path: Path) -> None:
    """One way each: what an application calls is on the Engine, and no method of a side
    is also one of the Engine's."""
    methods = {name for name in public(Engine) if callable(getattr(Engine, name))}
    assert len(methods) <= 30, sorted(methods)
    assert not (methods & (public(WebSide) - {"open"})), methods & public(WebSide)
    assert not (methods & (public(Operator) - {"open", "pending_approvals"}))


def test_what_the_engine_returns_is_documented_field_by_field() -> None:
    rows = {_CODE.findall(row[0])[0]: row[1] for row in subsection_rows("What the Engine returns")}
    assert rows, "reference §17 lists no record the Engine returns"
    for name, cell in rows.items():
        record = getattr(results, name, None) or getattr(tether, name)  # AuditPage's home
        fields, _, properties = cell.partition(";")
        named = {code for code in _CODE.findall(fields)}
        assert named == {f.name for f in dataclasses.fields(record)}, name
        for prop in _CODE.findall(properties):
            assert isinstance(getattr(record, prop, None), property), f"{name}.{prop}"
