"""``tether keys rotate`` (reference §20) in real processes, on both backends: killed after
a batch (``after_rotation_batch``), it leaves every value readable, some under the new key
and some under the old, and run again it finishes, forgetting the old key; a key the list
lacks, or a malformed list, exits 1 with ``invalid_config`` naming it and changes nothing."""

from __future__ import annotations

import json

import processes
import sealed


async def test_a_rotation_killed_after_a_batch_is_finished_by_running_it_again(
    db_url: str,
) -> None:
    old, new = sealed.entry("k1"), sealed.entry("k2")
    engine, notifier = sealed.engine(db_url, sealed.ring(old), "kr1")
    try:
        story = await sealed.story(engine, notifier, "kr1")
    finally:
        engine.close()
    env = processes.tether_env(db_url, TETHER_ENCRYPTION_KEYS=f"{new},{old}")
    crashed = processes.tether(
        "keys",
        "rotate",
        "--batch",
        "2",
        env={**env, "TETHER_FAILPOINTS": "after_rotation_batch=crash"},
    )
    assert crashed.returncode == 137, crashed.stderr
    mixed, _ = sealed.engine(db_url, sealed.ring(new, old))
    try:
        in_use = sealed.keys_in_use(mixed)
        assert in_use.get("k2", 0) >= 1 and in_use.get("k1", 0) >= 1, in_use
        assert await sealed.shown_run(mixed, story.run_id) == story.run
    finally:
        mixed.close()
    done = processes.tether("keys", "rotate", env=env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["key"] == "k2" and answer["retired"] == ["k1"] and answer["rotated"] >= 1
    only_new, _ = sealed.engine(db_url, sealed.ring(new))
    try:
        assert set(sealed.keys_in_use(only_new)) == {"k2"}
        assert await sealed.shown_run(only_new, story.run_id) == story.run
    finally:
        only_new.close()


async def test_keys_rotate_refuses_a_missing_key_or_a_malformed_list_and_changes_nothing(
    db_url: str,
) -> None:
    old = sealed.entry("k1")
    engine, notifier = sealed.engine(db_url, sealed.ring(old), "kr2")
    try:
        await sealed.story(engine, notifier, "kr2")
        before = sealed.keys_in_use(engine)
    finally:
        engine.close()
    for keys, named in (
        (sealed.entry("k2"), "'k1'"),
        ("", "'k1'"),
        (f"k2:{'A' * 8}", "entry 1 ('k2'): the key is 6 bytes"),
        (f"{old},{old}", "repeats the key id 'k1'"),
    ):
        env = processes.tether_env(db_url, TETHER_ENCRYPTION_KEYS=keys)
        refused = processes.tether("keys", "rotate", env=env)
        out = refused.stdout + refused.stderr
        assert refused.returncode == 1 and "invalid_config" in out and named in out, out
        assert old.split(":", 1)[1] not in out
    again, _ = sealed.engine(db_url, sealed.ring(old))
    try:
        assert sealed.keys_in_use(again) == before
    finally:
        again.close()
