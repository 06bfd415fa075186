"""The ``Idempotency-Key`` (reference §14): 1-255 printable ASCII characters, space
included; anything else is ``invalid_input``."""

from __future__ import annotations

from typing import Any

import pytest

from tether import inputs
from tether.errors import InvalidInput


@pytest.mark.parametrize("key", ["a", "k" * 255, " ", "~", "a key, with: punctuation!", "\x20\x7e"])
def test_printable_ascii_keys_of_1_to_255_characters_are_taken_as_they_are(key: str) -> None:
    assert inputs.idempotency_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "k" * 256,
        "clé",
        "\u2028",
        "a\tb",
        "a\nb",
        "a\x00b",
        "a\x1fb",
        "a\x7fb",
        "trailing newline\n",
        None,
        42,
        b"bytes",
    ],
)
def test_anything_else_is_invalid_input(key: Any) -> None:
    with pytest.raises(InvalidInput, match="Idempotency-Key must be 1-255 printable ASCII"):
        inputs.idempotency_key(key)
