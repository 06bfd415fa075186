"""Typed output (``tether.output``, reference §11) without a run: an ``output_type`` that is
not a describable pydantic model is refused when the agent is declared, and ``check`` reads
an answer as JSON or a fenced block, naming each error and feeding back at most twenty.
Runs with typed output are tests/integration/test_typed_output.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from quotes import INVALID, VALID, Quote

from tether import Agent
from tether.errors import ConfigError
from tether.output import check


class Opaque:
    """A type pydantic can hold but not describe in JSON schema."""


class Undescribable(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    thing: Opaque


@pytest.mark.parametrize(
    ("output_type", "expected"),
    [
        (dict, "must be a pydantic BaseModel subclass"),
        (Quote.model_validate(VALID), "must be a pydantic BaseModel subclass"),
        ("Quote", "must be a pydantic BaseModel subclass"),
        (list[Quote], "must be a pydantic BaseModel subclass"),
        (Undescribable, "has no JSON schema"),
    ],
)
def test_an_output_type_that_is_not_a_describable_model_is_refused_when_declared(
    output_type: Any, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected) as raised:
        Agent(name="bad", system_prompt="You price quotes.", output_type=output_type)
    assert raised.value.code == "invalid_config"
    assert "agent bad: output_type" in raised.value.message


@pytest.mark.parametrize(
    ("content", "locs"),
    [
        (json.dumps(VALID), []),
        (f"```\n{json.dumps(VALID)}\n```", []),
        (None, ["(answer)"]),
        ("   ", ["(answer)"]),
        ("no json here", ["(root)"]),
        ('{"account_id": 4471, "lines": [], "total": "lots"}', ["account_id", "total"]),
        (f"```json\n{json.dumps(INVALID)}\n```", ["lines.0.quantity", "total"]),
    ],
)
def test_check_accepts_json_or_a_fenced_block_and_names_each_error(
    content: str | None, locs: list[str]
) -> None:
    verdict = check(Quote, content)
    assert [e["loc"] for e in verdict.errors] == locs
    assert (verdict.value is None) == bool(locs)
    if not locs:
        assert verdict.stored == VALID


def test_feedback_lists_at_most_twenty_errors_and_counts_the_rest() -> None:
    many = json.dumps({"account_id": "a", "lines": [{"quantity": 0}] * 15, "total": 1})
    verdict = check(Quote, many)
    assert len(verdict.errors) == 30  # each line: sku missing, quantity not > 0
    content = verdict.feedback()["content"]
    assert content.count("\n- ") == 21  # twenty errors and the count of the rest
    assert "- ... and 10 more" in content
    assert verdict.event(4) == {"step": 4, "errors": verdict.errors[:20], "count": 30}
