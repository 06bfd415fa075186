"""What a person is shown of a stored value: hidden characters escaped and flagged
(reference §6, the approvals inbox), everything else exactly as stored."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tether import visible


def test_a_right_to_left_override_is_shown_escaped_and_flagged() -> None:
    deceptive = "acct-1234\u202e9876-tcca"
    assert visible.escape(deceptive) == "acct-1234\\u202e9876-tcca"
    assert list(visible.segments(deceptive)) == [
        ("acct-1234", False),
        ("\\u202e", True),
        ("9876-tcca", False),
    ]
    assert visible.has_hidden({"account": deceptive})


def test_invisible_characters_of_every_kind_are_escaped() -> None:
    for char, shown in [
        ("\u200b", "\\u200b"),  # zero-width space
        ("\u2066", "\\u2066"),  # left-to-right isolate
        ("\ufeff", "\\ufeff"),  # byte order mark
        ("\u3164", "\\u3164"),  # Hangul filler
        ("\ufe0f", "\\ufe0f"),  # variation selector
        ("\U000e0041", "\\U000e0041"),  # tag letter A
        ("\x1b", "\\u001b"),  # escape (a terminal's colours)
        ("\r", "\\u000d"),
        ("\u2028", "\\u2028"),
    ]:
        assert visible.escape(f"a{char}b") == f"a{shown}b", repr(char)


def test_ordinary_text_is_shown_as_stored() -> None:
    text = "Henderson — 200 pieces of SKU-4411, 5 %\n\tnext line: café, 日本, ½"
    assert visible.escape(text) == text
    assert not visible.has_hidden({"lines": [text], "n": 3, "ok": True, "none": None})


def test_keys_and_nested_strings_of_a_json_value_are_escaped() -> None:
    value = {"to\u200d": ["a\u202eb", {"n": 1}], "x": None}
    assert visible.escaped(value) == {"to\\u200d": ["a\\u202eb", {"n": 1}], "x": None}


@given(st.text())
def test_an_escaped_text_holds_no_hidden_character(text: str) -> None:
    shown = visible.escape(text)
    assert not visible.has_hidden(shown)
    assert "".join(piece for piece, _ in visible.segments(text)) == shown
