"""Users and API keys: keys are random, stored hashed, and resolve to their user."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tether.errors import InvalidInput
from tether.store import Store
from tether.store.schema import api_keys
from tether.users import add_user, ensure_demo_users, hash_key, user_for_key


def test_a_new_key_resolves_to_its_user_and_only_its_hash_is_stored(db_url: str) -> None:
    store = Store(db_url)
    key = add_user(store, "ana")
    assert key.startswith("tth_") and len(key) > 40
    assert user_for_key(store, key) == "ana"
    assert user_for_key(store, key + "x") is None
    with store.engine.connect() as conn:
        stored = [row[0] for row in conn.execute(sa.select(api_keys.c.key_hash))]
    assert stored == [hash_key(key)]
    second = add_user(store, "ana")
    assert second != key and user_for_key(store, second) == "ana"
    store.close()


def test_demo_users_get_their_fixed_keys_and_bad_names_are_refused(db_url: str) -> None:
    store = Store(db_url)
    ensure_demo_users(store)
    ensure_demo_users(store)  # safe twice
    assert user_for_key(store, "tether-demo-dana") == "dana"
    assert user_for_key(store, "tether-demo-miguel") == "miguel"
    with pytest.raises(InvalidInput):
        add_user(store, "no spaces allowed")
    with pytest.raises(InvalidInput):
        add_user(store, "eve", key="tether-demo-dana")
    store.close()
