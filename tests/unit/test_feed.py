"""The live event stream's cursor (``tether._runtime.feed``): ``after`` is a SEQ, as a number
or its text. The stream itself is tests/integration/test_live_events.py."""

from __future__ import annotations

from typing import Any

import pytest

from tether.inputs import after_seq


@pytest.mark.parametrize("value", ["0", "7", " 12 ", 0, 3])
def test_after_accepts_a_seq(value: Any) -> None:
    assert after_seq(value) == int(str(value).strip())
