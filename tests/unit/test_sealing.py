"""The keyring of ``TETHER_ENCRYPTION_KEYS`` and a value's stored form (reference §20):
entries are validated naming the entry (never the key), a sealed value opens only with its
key and names that key when it is missing, an altered one is refused, a clear value that
looks sealed is escaped, and content is compressed before it is sealed."""

from __future__ import annotations

import base64
import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.config import Settings
from tether.errors import ConfigError
from tether.sealing import (
    MARK,
    MissingKey,
    key_of,
    open_json,
    open_text,
    parse_keys,
    seal_json,
    seal_text,
)

KEY = base64.b64encode(b"k" * 32).decode()
OTHER = base64.b64encode(b"o" * 32).decode()


def _ring(raw: str):  # type: ignore[no-untyped-def]
    keyring = parse_keys(raw)
    assert keyring is not None
    return keyring


def test_the_first_key_seals_and_every_key_opens() -> None:
    old = _ring(f"a:{KEY}")
    both = _ring(f"b:{OTHER}, a:{KEY}")
    assert both.current == "b" and both.ids == ("b", "a")
    stored = seal_text(old, "hello")
    assert stored is not None and key_of(stored) == "a" and "hello" not in stored
    assert open_text(both, stored) == "hello"
    assert key_of(seal_text(both, "hello")) == "b"


def test_a_value_under_a_key_not_listed_names_the_key() -> None:
    stored = seal_json(_ring(f"gone:{KEY}"), {"x": 1})
    with pytest.raises(MissingKey, match="'gone'") as error:
        open_json(_ring(f"b:{OTHER}"), stored)
    assert error.value.code == "invalid_config" and error.value.key_id == "gone"
    with pytest.raises(MissingKey, match="'gone'"):
        open_json(None, stored)


def test_an_altered_value_or_a_different_key_under_the_same_id_is_refused() -> None:
    stored = seal_text(_ring(f"a:{KEY}"), "pay 100 to ann")
    assert stored is not None
    body = stored.rsplit(":", 1)[1]
    flipped = base64.b64encode(bytes([base64.b64decode(body)[0] ^ 1]) + base64.b64decode(body)[1:])
    with pytest.raises(ConfigError, match="does not open"):
        open_text(_ring(f"a:{KEY}"), stored.rsplit(":", 1)[0] + ":" + flipped.decode())
    with pytest.raises(ConfigError, match="does not open"):
        open_text(_ring(f"a:{OTHER}"), stored)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("k1", "entry 1 must be ID:BASE64KEY"),
        (f"k1:{KEY},bad id:{KEY}", "entry 2 must be ID:BASE64KEY"),
        (f"k1:{KEY},k1:{OTHER}", "entry 2 repeats the key id 'k1'"),
        ("k1:not base64!", "entry 1 .'k1'.: the key is not valid base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "the key is 5 bytes; AES-256 needs 32"),
        (f"k1:{KEY},", "entry 2 must be ID:BASE64KEY"),
    ],
)
def test_a_malformed_key_list_is_invalid_config_naming_the_entry(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        Settings.from_env({"TETHER_ENCRYPTION_KEYS": raw})
    assert error.value.code == "invalid_config"
    assert KEY not in str(error.value) and OTHER not in str(error.value)


def test_no_keys_means_nothing_is_sealed() -> None:
    assert Settings.from_env({}).keyring is None
    assert Settings.from_env({"TETHER_ENCRYPTION_KEYS": " "}).keyring is None
    assert "keyring" not in repr(Settings.from_env({"TETHER_ENCRYPTION_KEYS": f"a:{KEY}"}))


@given(st.text())
def test_any_text_comes_back_as_written_sealed_or_not(text: str) -> None:
    keyring = _ring(f"a:{KEY}")
    assert open_text(keyring, seal_text(keyring, text)) == text
    assert open_text(None, seal_text(None, text)) == text
    assert open_text(None, seal_text(None, MARK + text)) == MARK + text


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_any_json_value_comes_back_as_written_sealed_or_not(value: object) -> None:
    keyring = _ring(f"a:{KEY}")
    stored = json.loads(json.dumps(seal_json(keyring, value)))
    assert open_json(keyring, stored) == value
    looks_sealed = MARK + "1:a:" + json.dumps(value)
    assert open_json(None, json.loads(json.dumps(seal_json(None, looks_sealed)))) == looks_sealed


def test_content_is_compressed_before_it_is_sealed() -> None:
    keyring = _ring(f"a:{KEY}")
    message = {
        "role": "tool",
        "content": json.dumps({"rows": [{"id": i, "name": "widget"} for i in range(50)]}),
    }
    plain = json.dumps(message)
    stored = seal_json(keyring, message)
    assert len(json.dumps(stored)) < len(plain)
    random = base64.b64encode(os.urandom(300)).decode()
    assert open_text(keyring, seal_text(keyring, random)) == random
