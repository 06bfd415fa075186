"""``tether.inputs.json_value``, the one bounded JSON reader of request bodies and form
fields: JSON in, ``invalid_input`` for anything else, too long or nested too deeply,
counted without recursion."""

from __future__ import annotations

import pytest

from tether.errors import InvalidInput
from tether.inputs import MAX_JSON_DEPTH, json_value


def test_json_within_the_bounds_is_read_as_the_standard_parser_reads_it() -> None:
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_value(nested, "x") is not None
    assert json_value('{"a": "[[[{{{", "b": [1, 2.5, null, true]}', "x") == {
        "a": "[[[{{{",
        "b": [1, 2.5, None, True],
    }
    assert json_value(b'"\\"]]]"', "x") == '"]]]'  # brackets in strings do not nest


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested deeper than"),
        ('{"a":' * 20_000 + "1" + "}" * 20_000, "nested deeper than"),
        ("[" * 100_000, "nested deeper than"),  # malformed as well: refused before parsing
        ("[NaN]", "not valid JSON"),
        ("Infinity", "not valid JSON"),
        ("{'a': 1}", "not valid JSON"),
        ("", "not valid JSON"),
        (b"\xff", "not UTF-8"),
    ],
    ids=["just-over", "objects", "unclosed", "nan", "infinity", "quotes", "empty", "bytes"],
)
def test_anything_else_is_invalid_input_that_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says) as refused:
        json_value(text, "the body")
    assert refused.value.message.startswith("the body ")


def test_text_longer_than_the_limit_is_refused() -> None:
    with pytest.raises(InvalidInput, match="longer than 10 characters"):
        json_value('"' + "x" * 20 + '"', "the field", max_chars=10)
