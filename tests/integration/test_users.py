"""Users and API keys: keys are random, stored hashed, and resolve to their user."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tether.errors import InvalidInput
from tether.store import Store
from tether.store.schema import api_keys
from tether.store.users import add_user, hash_key


def test_a_new_key_resolves_to_its_user_and_only_its_hash_is_stored(db_url: str) -> None:
    store = Store(db_url)
    key = add_user(store, "ana")
    assert key.startswith("tth_") and len(key) > 40
    assert store.user_for_key(key) == "ana"
    assert store.user_for_key(key + "x") is None
    with store.engine.connect() as conn:
        stored = [row[0] for row in conn.execute(sa.select(api_keys.c.key_hash))]
    assert stored == [hash_key(key)]
    second = add_user(store, "ana")
    assert second != key and store.user_for_key(second) == "ana"
    store.close()


def test_fixed_keys_are_kept_twice_and_bad_names_or_taken_keys_are_refused(db_url: str) -> None:
    store = Store(db_url)
    for _ in range(2):  # safe twice
        store.add_user("dana", "fixed-dana")
        store.add_user("miguel", "fixed-miguel")
    assert store.user_for_key("fixed-dana") == "dana"
    assert store.user_for_key("fixed-miguel") == "miguel"
    with pytest.raises(InvalidInput):
        add_user(store, "no spaces allowed")
    with pytest.raises(InvalidInput):
        add_user(store, "eve", key="fixed-dana")
    assert store.user_for_key("fixed-dana") == "dana"
    store.close()
