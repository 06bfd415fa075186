"""The live event stream's cursor (``tether._runtime.live.events``): ``after`` is a SEQ, as a number
or its text. The stream itself is tests/integration/test_live_events.py."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import InvalidInput
from tether.inputs import after_seq


@pytest.mark.parametrize("value", ["0", "7", " 12 ", 0, 3])
def test_after_accepts_a_seq(value: Any) -> None:
    assert after_seq(value) == int(str(value).strip())


@pytest.mark.parametrize(
    "value", ["²", "①", "٣", "12٣", "\U0001d7d7", "-1", "1.5", "", " ", "1" * 19, -1, True]
)
def test_after_refuses_anything_but_ascii_digits(value: Any) -> None:
    """``str.isdigit`` accepts superscripts and circled digits (which ``int`` refuses: a
    500) and other scripts' digits (which ``int`` reads: ``٣`` would mean 3)."""
    with pytest.raises(InvalidInput):
        after_seq(value)
