"""Erasing a user's data with the real CLI (reference §20): ``tether users erase``
killed after its first batch of runs (``after_erasure_batch=crash``) leaves the user
partly erased, never half a run, and the same command from another process finishes it,
counting the rest; the name is then free. And ``tether users add|set --retention-days``:
shown by ``users list``, a bad value refused with nothing changed."""

from __future__ import annotations

import json

import processes
import sqlalchemy as sa
from erased_data import marker, mentions, stopped_runs

from tether.store import Store
from tether.store.sql.schema import run_events, run_messages, runs

BATCH = 200  # TETHER's purge batch: an erasure deletes this many runs per transaction


def test_an_erasure_killed_after_its_first_batch_is_finished_by_another_process(
    db_url: str,
) -> None:
    mark, kim = marker(), "kim-" + marker()
    store = Store(db_url)
    store.add_user(kim, "key-of-kim")
    store.add_user("lee", "key-of-lee")
    stopped_runs(store, kim, 2 * BATCH + 50, question=mark)
    [lees] = stopped_runs(store, "lee", 1)
    env = processes.tether_env(db_url)

    crashed = processes.tether(
        "users", "erase", kim, env={**env, "TETHER_FAILPOINTS": "after_erasure_batch=crash"}
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    # One batch went, whole; every run left is whole too, and kim can no longer sign in.
    left = _runs_of(store, kim)
    assert len(left) == BATCH + 50
    assert all(messages == count and events > 0 for _, count, messages, events in left)
    assert store.user_for_key("key-of-kim") is None
    refused = processes.tether("users", "add", kim, env=env)
    assert refused.returncode == 1 and "tether users erase" in refused.stderr

    finished = processes.tether("users", "erase", kim, env=env)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout) == {
        "erased": {"runs": BATCH + 50, "threads": 2 * BATCH + 50, "schedules": 0}
    }
    assert mentions(db_url, [mark, kim]) == []
    assert [run_id for run_id, *_ in _runs_of(store, "lee")] == [lees]
    again = processes.tether("users", "add", kim, env=env)  # the name is free
    assert again.returncode == 0, again.stderr
    store.close()


def test_users_retention_days_is_set_shown_and_a_bad_one_changes_nothing(db_url: str) -> None:
    env = processes.tether_env(db_url)
    added = processes.tether("users", "add", "mia", "--retention-days", "1.5", env=env)
    assert added.returncode == 0, added.stderr
    for bad in ("0", "-2", "nan", "inf"):
        refused = processes.tether("users", "set", "mia", "--retention-days", bad, env=env)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "error invalid_input" in refused.stderr and "retention days" in refused.stderr
    not_a_number = processes.tether("users", "set", "mia", "--retention-days", "soon", env=env)
    assert not_a_number.returncode == 2 and "--retention-days" in not_a_number.stderr
    refused_add = processes.tether("users", "add", "ned", "--retention-days", "0", env=env)
    assert refused_add.returncode == 1 and "error invalid_input" in refused_add.stderr
    changed = processes.tether("users", "set", "mia", "--retention-days", "0.25", env=env)
    assert changed.returncode == 0 and "retention days 0.25" in changed.stdout
    listed = processes.tether("users", "list", env=env)
    users = {u["name"]: u["retention_days"] for u in json.loads(listed.stdout)["items"]}
    assert users == {"mia": 0.25}
    bad_name = processes.tether("users", "erase", "no such name", env=env)
    assert bad_name.returncode == 1 and "error invalid_input" in bad_name.stderr
    unknown = processes.tether("users", "erase", "nobody", env=env)
    assert json.loads(unknown.stdout) == {"erased": {"runs": 0, "threads": 0, "schedules": 0}}


def _runs_of(store: Store, user: str) -> list[tuple[str, int, int, int]]:
    """Each run of ``user``: id, message count, stored messages, stored events."""
    messages = sa.select(sa.func.count()).where(run_messages.c.run_id == runs.c.id)
    events = sa.select(sa.func.count()).where(run_events.c.run_id == runs.c.id)
    query = sa.select(
        runs.c.id, runs.c.message_count, messages.scalar_subquery(), events.scalar_subquery()
    ).where(runs.c.user_id == user)
    with store.engine.connect() as conn:
        return [(r[0], r[1], r[2], r[3]) for r in conn.execute(query)]
