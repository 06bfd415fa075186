"""What a person is shown of a stored value on the inbox's pages (reference §6): the Jinja
filters and tests the templates use, with every character visibly distinct.

A bidirectional control or an invisible character in a question, an argument or a preview
would let the page read as something other than what the decision's digest binds, so
``visible`` shows each one escaped (``\\u202e``) inside a marked element, and ``hides`` tells
a template when to say so in a warning line. The environment's ``finalize`` is the net under
them: any other string a template writes, an attribute's value included, has its hidden
characters escaped (unmarked) before Jinja's autoescaping, so none ever reaches a page.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

from tether import visible as chars
from tether.runs import iso

_MARK = Markup('<span class="hidden-char" title="{}">{}</span>')


def show(value: Any) -> str:
    """A stored scalar or structure as text (escaped by the template): None as a dash,
    strings as they are, the rest as JSON."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _title(piece: str) -> str:
    """What the mark of an escaped character says on hover: its code point and name."""
    char = chr(int(piece[2:], 16))
    name = unicodedata.name(char, "unnamed")
    return f"hidden character U+{ord(char):04X} {name}, shown escaped"


def visible(value: Any) -> Markup:
    """``value`` (as ``show`` writes it) for a page: HTML-escaped, each hidden character
    written as its escape in a ``hidden-char`` element, so it differs from a ``\\u``
    typed as text. Markup (a macro's output) is returned as it is."""
    if isinstance(value, Markup):
        return value
    parts = [
        _MARK.format(_title(piece), piece) if hidden else escape(piece)
        for piece, hidden in chars.segments(show(value))
    ]
    return Markup("").join(parts)


def hides(*values: Any) -> bool:
    """Whether any of ``values`` (strings, or JSON values with strings inside) holds a
    hidden character: the page then says so."""
    return any(chars.has_hidden(value) for value in values)


def finalize(value: Any) -> Any:
    """Every ``{{ ... }}`` of a template goes through this before autoescaping: a string
    not already marked up has its hidden characters escaped, wherever it is written."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return chars.escape(value)
    return value


def json_text(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON a person can read and edit, each hidden character written as a
    JSON escape (``\\u202e``, a surrogate pair beyond the Basic Multilingual Plane): the
    text reads back as exactly ``value``, and shows nothing hidden."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, indent=indent)
    if not chars.has_hidden(text):
        return text
    return "".join(json.dumps(char)[1:-1] if chars.is_hidden(char) else char for char in text)


def ticks(text: Any) -> Markup:
    """``text`` for a page as ``visible`` writes it, its spans between backticks (a
    description's ``code``) as ``<code>`` elements."""
    pieces = str(text).split("`")
    if len(pieces) % 2 == 0:  # an odd backtick: shown as written
        return visible(str(text))
    return Markup("").join(
        Markup("<code>{}</code>").format(visible(piece)) if index % 2 else visible(piece)
        for index, piece in enumerate(pieces)
    )


def when(epoch: float | None) -> str:
    """Epoch seconds of the database clock, for people."""
    stamp = iso(epoch)
    return stamp[:19].replace("T", " ") + " UTC" if stamp else "—"


def columns(rows: Sequence[Any]) -> list[str] | None:
    """The union of keys of a list of mappings, in first-seen order; None if the list
    holds anything else (it is then shown as a plain list)."""
    if not rows or not all(isinstance(row, Mapping) for row in rows):
        return None
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(str(key) for key in row))
    return list(seen)


def time_left(seconds: float) -> str:
    """What remains of an approval window, for people."""
    if seconds <= 0:
        return "expired"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"
