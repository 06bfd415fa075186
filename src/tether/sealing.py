"""Stored content sealed at rest (reference §20): AES-256-GCM through ``cryptography``.

``TETHER_ENCRYPTION_KEYS`` lists ``ID:BASE64KEY`` entries; the first seals, every one
opens. A sealed value is stored as one string, ``tether:sealed:1:ID:BASE64`` (the key's id
in the clear, then the nonce and the ciphertext with its tag), so a column holds sealed
values and clear ones side by side while keys are turned on or rotated. A clear value that
happens to begin with the mark is stored escaped (``tether:sealed:0:...``), so it is never
read as sealed. Content is compressed before it is sealed when that is shorter, so a
sealed step stores about what a clear one does. Digests bind the plaintext: sealing never
changes what a person approves.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tether.errors import ConfigError

MARK = "tether:sealed:"
SEALED = MARK + "1:"
ESCAPED = MARK + "0:"
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NONCE = 12
# Before sealing, the plaintext's first byte says how it was packed.
_RAW = b"r"
_ZLIB = b"z"
# Shorter plaintexts are not worth compressing (zlib's header and checksum cost 6 bytes).
_COMPRESS_FROM = 64


class MissingKey(ConfigError):
    """A stored value is sealed with a key the process was not given."""

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"a stored value is sealed with key {key_id!r}, which TETHER_ENCRYPTION_KEYS "
            "does not list: add that key to the list (after the first) to read it"
        )
        self.key_id = key_id


@dataclass(frozen=True)
class Keyring:
    """The keys of ``TETHER_ENCRYPTION_KEYS``: ``current`` seals, every one opens."""

    current: str
    _keys: dict[str, AESGCM] = field(repr=False)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def seal(self, plain: bytes) -> str:
        """``plain`` sealed under the current key, as the stored string."""
        packed = _pack(plain)
        nonce = os.urandom(_NONCE)
        sealed = self._keys[self.current].encrypt(nonce, packed, self.current.encode())
        return f"{SEALED}{self.current}:{base64.b64encode(nonce + sealed).decode()}"

    def open(self, stored: str) -> bytes:
        """The plaintext of a sealed string (``SEALED...``); ``MissingKey`` naming the id
        when the key is not in the ring, ``ConfigError`` when the value was altered."""
        key_id, _, body = stored[len(SEALED) :].partition(":")
        key = self._keys.get(key_id)
        if key is None:
            raise MissingKey(key_id)
        try:
            raw = base64.b64decode(body, validate=True)
            packed = key.decrypt(raw[:_NONCE], raw[_NONCE:], key_id.encode())
        except Exception as exc:  # InvalidTag, a truncated or mangled value
            raise ConfigError(
                f"a stored value sealed with key {key_id!r} does not open with it: it was "
                "altered, or the key listed under that id is not the one that sealed it"
            ) from exc
        return _unpack(packed)


def _pack(plain: bytes) -> bytes:
    if len(plain) >= _COMPRESS_FROM:
        packed = zlib.compress(plain, 1)
        if len(packed) < len(plain):
            return _ZLIB + packed
    return _RAW + plain


def _unpack(packed: bytes) -> bytes:
    if packed[:1] == _ZLIB:
        return zlib.decompress(packed[1:])
    return packed[1:]


def parse_keys(raw: str | None) -> Keyring | None:
    """``TETHER_ENCRYPTION_KEYS`` read: None when unset or empty; ``invalid_config`` naming
    the entry (never its key) when one is malformed, repeated or not 32 bytes."""
    if raw is None or not raw.strip():
        return None
    keys: dict[str, AESGCM] = {}
    for number, entry in enumerate(raw.split(","), start=1):
        where = f"TETHER_ENCRYPTION_KEYS entry {number}"
        key_id, colon, encoded = entry.strip().partition(":")
        if not colon or not KEY_ID.fullmatch(key_id):
            raise ConfigError(
                f"{where} must be ID:BASE64KEY, the id of letters, digits, '_' or '-' (up to 64)"
            )
        if key_id in keys:
            raise ConfigError(f"{where} repeats the key id {key_id!r}")
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where} ({key_id!r}): the key is not valid base64") from None
        if len(key) != 32:
            raise ConfigError(
                f"{where} ({key_id!r}): the key is {len(key)} bytes; AES-256 needs 32 "
                '(make one with: python -c "import os, base64; '
                'print(base64.b64encode(os.urandom(32)).decode())")'
            )
        keys[key_id] = AESGCM(key)
    return Keyring(current=next(iter(keys)), _keys=keys)


def new_key() -> str:
    """A fresh key, base64: what an entry of ``TETHER_ENCRYPTION_KEYS`` carries."""
    return base64.b64encode(os.urandom(32)).decode()


# -- stored values ----------------------------------------------------------------------------


def seal_text(keyring: Keyring | None, value: str | None) -> str | None:
    """A text column's stored form of ``value``."""
    if value is None:
        return None
    if keyring is not None:
        return keyring.seal(value.encode())
    return ESCAPED + value if value.startswith(MARK) else value


def open_text(keyring: Keyring | None, stored: str | None) -> str | None:
    """The value of a text column's stored form."""
    if stored is None or not stored.startswith(MARK):
        return stored
    if stored.startswith(ESCAPED):
        return stored[len(ESCAPED) :]
    return _ring(keyring, stored).open(stored).decode()


def seal_json(keyring: Keyring | None, value: Any) -> Any:
    """A JSON column's stored form of ``value`` (a sealed value is one JSON string)."""
    if value is None:
        return None
    if keyring is not None:
        return keyring.seal(_dumps(value))
    if isinstance(value, str) and value.startswith(MARK):
        return ESCAPED + json.dumps(value)
    return value


def open_json(keyring: Keyring | None, stored: Any) -> Any:
    """The value of a JSON column's stored form (already decoded from its JSON text)."""
    if not isinstance(stored, str) or not stored.startswith(MARK):
        return stored
    if stored.startswith(ESCAPED):
        return json.loads(stored[len(ESCAPED) :])
    return json.loads(_ring(keyring, stored).open(stored))


def key_of(stored: Any) -> str | None:
    """The id of the key a stored value is sealed with; None for a clear value."""
    if isinstance(stored, str) and stored.startswith(SEALED):
        return stored[len(SEALED) :].partition(":")[0]
    return None


def _ring(keyring: Keyring | None, stored: str) -> Keyring:
    if keyring is None:
        raise MissingKey(key_of(stored) or "?")
    return keyring


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
