"""What a person is shown of a stored value: every character visibly distinct.

A bidirectional control (U+202E turns ``acct-6789`` into what reads as ``acct-9876``) or an
invisible character (a zero-width space, a word joiner, a tag character) would let a
stored value read as something other than what its digest binds. Wherever a person
approves or reads a value (the inbox, the command line), such characters are shown
escaped, as ``\\u202e``, and flagged; nothing stored is changed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from typing import Any

# Categories whose characters render as nothing, or change how their neighbours render:
# controls (but tab and newline, which read as the space they make), format characters
# (the bidirectional controls, zero-width characters, tags), line and paragraph
# separators, surrogates, private use and unassigned code points.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_SHOWN_CONTROLS = frozenset("\n\t")
# Letters and marks that render as blank space or as nothing: Hangul fillers, the braille
# blank, the combining grapheme joiner, the Mongolian vowel separator, and the variation
# selectors (which restyle the character before them).
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u180e")
_VARIATION_SELECTORS = (range(0xFE00, 0xFE10), range(0xE0100, 0xE01F0))


def is_hidden(char: str) -> bool:
    """Whether ``char`` (one character) would not be seen, or would change how others read."""
    if char in _SHOWN_CONTROLS:
        return False
    if char in _BLANK or unicodedata.category(char) in _HIDDEN_CATEGORIES:
        return True
    point = ord(char)
    return any(point in selectors for selectors in _VARIATION_SELECTORS)


def escape_char(char: str) -> str:
    """``\\u202e`` for U+202E; ``\\U000e0041`` beyond the Basic Multilingual Plane."""
    point = ord(char)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def segments(text: str) -> Iterator[tuple[str, bool]]:
    """``text`` as runs of plain text and escaped hidden characters, in order: ``(piece,
    hidden)``. A page marks the hidden pieces up, so they differ from a literal ``\\u``."""
    plain: list[str] = []
    for char in text:
        if is_hidden(char):
            if plain:
                yield "".join(plain), False
                plain = []
            yield escape_char(char), True
        else:
            plain.append(char)
    if plain:
        yield "".join(plain), False


def escape(text: str) -> str:
    """``text`` with each hidden character replaced by its escape."""
    return "".join(piece for piece, _ in segments(text))


def has_hidden(value: Any) -> bool:
    """Whether a string, or any key or string inside a JSON value, holds a hidden character."""
    if isinstance(value, str):
        return any(is_hidden(char) for char in value)
    if isinstance(value, dict):
        return any(has_hidden(k) or has_hidden(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_hidden(item) for item in value)
    return False


def escaped(value: Any) -> Any:
    """A JSON value with every string (keys included) escaped; other values unchanged."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {escape(str(k)): escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escaped(item) for item in value]
    return value
