"""Users and API keys: keys are random, stored hashed, and resolve to their user."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tether.errors import InvalidInput
from tether.store import Store
from tether.store.sql.schema import api_keys
from tether.store.users import UserSettings, add_user, hash_key


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


def test_removing_a_user_revokes_their_keys_and_sessions_and_keeps_their_name_taken(
    db_url: str,
) -> None:
    store = Store(db_url)
    dana, eve = add_user(store, "dana"), add_user(store, "eve")
    add_user(store, "dana")  # a second key
    assert store.open_sign_in(dana, hash_key("s-dana"), 3600) == "dana"
    assert store.open_sign_in(eve, hash_key("s-eve"), 3600) == "eve"
    assert store.open_sign_in("tth_no_such_key", hash_key("s-x"), 3600) is None
    assert [(u["name"], u["keys"]) for u in store.list_users()] == [("dana", 2), ("eve", 1)]
    removed = store.remove_user("dana")
    assert removed is not None and removed.keys_revoked == 2
    assert store.remove_user("dana") is None  # safe twice
    assert store.user_for_key(dana) is None and store.sign_in_user(hash_key("s-dana")) is None
    assert store.sign_in_user(hash_key("s-eve")) == "eve"
    listed = {u["name"]: u for u in store.list_users()}
    assert listed["dana"]["removed_at"] is not None and listed["dana"]["keys"] == 0
    assert listed["eve"]["removed_at"] is None
    # The name stays taken until the user's data is erased; nothing of theirs comes back.
    with pytest.raises(InvalidInput, match="tether users erase dana"):
        add_user(store, "dana")
    assert store.rotate_key("dana", "tth_for-a-removed-user") is False
    assert store.set_user("dana", UserSettings(max_priority=5)) is False
    with pytest.raises(InvalidInput, match="revoked"):
        store.add_user("frank", dana)  # a revoked key is never any user's again
    assert [(u["name"], u["keys"]) for u in store.list_users()] == [("dana", 0), ("eve", 1)]
    store.close()


def test_a_revoked_published_key_is_never_put_back(db_url: str) -> None:
    store = Store(db_url)
    bound = UserSettings(max_priority=10)
    for _ in range(2):  # every start of serve or migrate
        assert store.add_published_user("dana", "tether-demo-dana", bound) is True
        assert store.add_published_user("miguel", "tether-demo-miguel", bound) is True
    assert store.user_for_key("tether-demo-dana") == "dana"
    fresh = "tth_rotated"
    assert store.rotate_key("dana", fresh)
    assert store.remove_user("miguel") is not None
    for _ in range(2):
        assert store.add_published_user("dana", "tether-demo-dana", bound) is True
        assert store.add_published_user("miguel", "tether-demo-miguel", bound) is False
    owners = [store.user_for_key(k) for k in ("tether-demo-dana", fresh, "tether-demo-miguel")]
    assert owners == [None, "dana", None]
    with pytest.raises(InvalidInput, match="revoked"):
        store.add_user("dana", "tether-demo-dana")
    store.close()


def test_a_published_user_that_exists_gets_no_key_and_keeps_the_operators_bound(
    db_url: str,
) -> None:
    store = Store(db_url)
    # Rotated before revoked keys were recorded: the user is there, their published key not.
    store.add_user("dana", "tth_rotated-long-ago")
    store.add_user("eve", "tth_eve", UserSettings(max_priority=-2))
    bound = UserSettings(max_priority=10)
    for user in ("dana", "eve", "zoe"):
        assert store.add_published_user(user, f"published-{user}", bound) is True
    owners = [store.user_for_key(f"published-{user}") for user in ("dana", "eve", "zoe")]
    assert owners == [None, None, "zoe"]
    bounds = {u["name"]: u["max_priority"] for u in store.list_users()}
    assert bounds == {"dana": 10, "eve": -2, "zoe": 10}  # filled where the operator set none
    assert store.set_user("dana", UserSettings(max_priority=1)) is True
    assert store.add_published_user("dana", "published-dana", bound) is True
    assert {u["name"]: u["max_priority"] for u in store.list_users()}["dana"] == 1
    assert store.set_user("nobody", UserSettings(max_priority=1)) is False
    store.close()


def test_rotating_a_key_revokes_every_old_key_and_its_sessions(db_url: str) -> None:
    store = Store(db_url)
    old = add_user(store, "eve")
    store.open_sign_in(old, hash_key("s-eve"), 3600)
    assert store.rotate_key("eve", "tth_fresh-key") is True
    assert store.user_for_key(old) is None and store.user_for_key("tth_fresh-key") == "eve"
    assert store.sign_in_user(hash_key("s-eve")) is None
    with pytest.raises(InvalidInput, match="revoked"):
        store.add_user("eve", old)  # for good
    assert store.user_for_key(old) is None
    assert store.rotate_key("nobody", "tth_other") is False
    assert store.user_for_key("tth_other") is None
    store.close()


def test_a_session_ends_by_signing_out_or_expiring_on_the_databases_clock(db_url: str) -> None:
    store = Store(db_url)
    key = add_user(store, "dana")
    store.open_sign_in(key, hash_key("s-1"), 3600)
    store.open_sign_in(key, hash_key("s-2"), 3600)
    store.open_sign_in(key, hash_key("s-old"), -1)  # already past its expiry
    store.end_sign_in(hash_key("s-1"))
    store.end_sign_in(hash_key("s-1"))  # safe twice
    alive = [store.sign_in_user(hash_key(s)) for s in ("s-1", "s-2", "s-old")]
    assert alive == [None, "dana", None]
    store.close()
