"""A retention of a user's own (reference §20) on both backends: ``add_user`` /
``set_user`` with ``retention_days`` (decimals, more than 0), shown by ``list_users``; the
reaper's purge keeps each user's halted and finished runs their own days, else
``TETHER_RETENTION_DAYS``; a bad value is ``invalid_input`` and changes nothing."""

from __future__ import annotations

import math

import inprocess
import pytest
from waiting import until

from tether import Engine
from tether.errors import InvalidInput, NotFound


async def _answered(engine: Engine, *users: str) -> dict[str, str]:
    """One answered run of each of ``users``, once the database's clock is past them by
    more than a tiny retention (1e-7 days is 8.6 ms)."""
    ids = {user: (await engine.ask(user, "q")).run_id for user in users}
    last = max([(await engine.get_run(i)).run.updated_at for i in ids.values()])
    await until(lambda: engine.runner.store.now() - last > 0.05)
    return ids


async def _kept(engine: Engine) -> set[str]:
    return {r.user_id for r in await engine.list_runs()}


async def test_each_user_keeps_their_runs_for_their_own_retention(db_url: str) -> None:
    usual = inprocess.tiny_engine(db_url)  # TETHER_RETENTION_DAYS: 30
    await usual.operator.add_user("brief", retention_days=1e-7)
    await usual.operator.add_user("lasting")
    await usual.operator.set_user("lasting", retention_days=1000.5)
    await _answered(usual, "brief", "lasting", "plain")
    # brief's own retention is past; the others' (30 days, 1000.5 days) are not.
    assert await usual.runner.purge_retained() == 1
    assert await _kept(usual) == {"lasting", "plain"}
    # With a short TETHER_RETENTION_DAYS, plain's run goes and lasting's stays.
    hasty = inprocess.tiny_engine(db_url, retention_days=1e-7)
    assert await hasty.runner.purge_retained() == 1
    assert await _kept(hasty) == {"lasting"}
    assert await hasty.runner.purge_retained() == 0
    listed = {u["name"]: u["retention_days"] for u in await usual.operator.list_users()}
    assert listed == {"brief": 1e-7, "lasting": 1000.5}
    usual.close()
    hasty.close()


async def test_a_bad_retention_is_refused_and_changes_nothing(db_url: str) -> None:
    engine = inprocess.tiny_engine(db_url)
    await engine.operator.add_user("ida", retention_days=2)
    for bad in (0, -1, 0.0, math.nan, math.inf, 1e7, True, "3"):
        with pytest.raises(InvalidInput, match="retention days"):
            await engine.operator.set_user("ida", retention_days=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="retention days"):
            await engine.operator.add_user("jo", retention_days=bad)  # type: ignore[arg-type]
    listed = {u["name"]: u["retention_days"] for u in await engine.operator.list_users()}
    assert listed == {"ida": 2.0}
    with pytest.raises(NotFound):
        await engine.operator.set_user("nobody", retention_days=1)
    engine.close()
