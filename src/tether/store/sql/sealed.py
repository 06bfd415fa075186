"""The column types of stored content (reference §20): a value is sealed on its way in and
opened on its way out, with the keyring of the engine that carries it.

The keyring rides on the SQLAlchemy engine's own dialect object (``attach``), so every
statement of that engine, whatever builds it, seals with it, and two engines of one
process (tests, a rotation beside a worker) never share one. A value already in its stored
form (``Stored``: sealed in Python by a step write that bypasses SQLAlchemy's processors)
passes through as it is; any other string is a person's value, so one that merely looks
sealed is escaped, never trusted.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine

from tether.sealing import Keyring, open_json, open_text, seal_json, seal_text

_ATTRIBUTE = "tether_keyring"


class Stored(str):
    """A value in its stored form already (sealed, or escaped): bound as it is."""

    __slots__ = ()


def attach(engine: Engine, keyring: Keyring | None) -> None:
    """Seal and open every content value ``engine`` carries with ``keyring``."""
    setattr(engine.dialect, _ATTRIBUTE, keyring)


def keyring_of(dialect: Dialect) -> Keyring | None:
    """The keyring ``attach`` gave the engine of ``dialect`` (None: nothing sealed)."""
    keyring: Keyring | None = getattr(dialect, _ATTRIBUTE, None)
    return keyring


def stored_json(keyring: Keyring | None, value: Any) -> Any:
    """``value``'s stored form for a JSON column, marked so no processor seals it again."""
    stored = seal_json(keyring, value)
    return Stored(stored) if isinstance(stored, str) and stored is not value else stored


def stored_text(keyring: Keyring | None, value: str | None) -> str | None:
    stored = seal_text(keyring, value)
    return Stored(stored) if stored is not None and stored is not value else stored


class SealedJSON(sa.types.TypeDecorator[Any]):
    """A JSON column whose value carries content."""

    impl = sa.JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None or isinstance(value, Stored):
            return value
        return seal_json(keyring_of(dialect), value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return open_json(keyring_of(dialect), value)


class SealedText(sa.types.TypeDecorator[str]):
    """A text column whose value carries content."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or isinstance(value, Stored):
            return value
        return seal_text(keyring_of(dialect), value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return open_text(keyring_of(dialect), value)


# -- the step writes that bypass the columns' processors ---------------------------------------


def sealed_turn(
    keyring: Keyring | None,
    params: dict[str, Any],
    messages: list[dict[str, Any]],
    intents: list[dict[str, Any]],
    events: list[tuple[str, dict[str, Any]]],
) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]], list[tuple[str, Any]]]:
    """A turn's values in their stored form: its messages, its ledger entries' arguments
    and results, its events' data and a final turn's typed output."""
    if "b_output" in params:
        params = {**params, "b_output": stored_json(keyring, params["b_output"])}
    return (
        params,
        [stored_json(keyring, m) for m in messages],
        [_sealed_entry(keyring, intent) for intent in intents],
        [(kind, stored_json(keyring, data)) for kind, data in events],
    )


def sealed_result(
    keyring: Keyring | None, params: dict[str, Any], message: Any, event: Any
) -> tuple[dict[str, Any], Any, Any]:
    """A tool result's values in their stored form: its ledger result, message and event."""
    params = {**params, "b_result": stored_json(keyring, params.get("b_result"))}
    return params, stored_json(keyring, message), stored_json(keyring, event)


def _sealed_entry(keyring: Keyring | None, entry: dict[str, Any]) -> dict[str, Any]:
    sealed = {**entry, "arguments": stored_json(keyring, entry["arguments"])}
    if "result" in entry:
        sealed["result"] = stored_json(keyring, entry["result"])
    return sealed
