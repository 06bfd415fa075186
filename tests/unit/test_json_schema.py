"""Tool arguments described by a JSON schema (``tether.tools.json_schema``): the schema the
model sees is the one given, arguments are checked against it with every violation at its
path, and a schema that cannot work is refused when the tool is declared."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tether import Tool
from tether.errors import ConfigError
from tether.tools.json_schema import json_arguments
from tether.tools.tool import InvalidToolArguments

SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "add_noteArguments",
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "json": {"type": "integer"},
    },
    "required": ["title"],
    "additionalProperties": False,
}


def make_tool() -> Tool:
    async def fn(**arguments: Any) -> Any:
        return arguments

    return Tool(
        name="add_note",
        description="Add a note.",
        args_model=json_arguments("add_note", SCHEMA),
        fn=fn,
        takes_context=False,
    )


def test_the_model_sees_the_schema_as_given_without_its_title() -> None:
    spec = make_tool().spec()
    assert spec.parameters == {k: v for k, v in SCHEMA.items() if k != "title"}
    assert SCHEMA["title"] == "add_noteArguments"  # the given schema is not changed


def test_valid_arguments_are_fields_any_name_included() -> None:
    args = make_tool().validate({"title": "t", "tags": ["a"], "json": 3})
    assert args.model_dump(mode="json") == {"title": "t", "tags": ["a"], "json": 3}
    assert args.title == "t"  # type: ignore[attr-defined]


def test_every_violation_is_reported_at_its_path() -> None:
    with pytest.raises(InvalidToolArguments) as invalid:
        make_tool().validate({"title": "", "tags": ["a", 2], "extra": 1})
    message = invalid.value.message
    assert "title: '' should be non-empty" in message
    assert "tags.1: 2 is not of type 'string'" in message
    assert "Additional properties are not allowed ('extra' was unexpected)" in message


def test_a_schema_that_is_not_json_schema_or_not_an_object_is_refused() -> None:
    with pytest.raises(ConfigError, match="tool bad: invalid JSON schema"):
        json_arguments("bad", {"type": "object", "properties": {"a": {"type": "nope"}}})
    with pytest.raises(ConfigError, match="must be an object schema"):
        json_arguments("bad", {"type": "array"})


def test_import_tether_needs_neither_mcp_nor_jsonschema() -> None:
    probe = "import sys, tether; print(sorted({'mcp', 'jsonschema'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
