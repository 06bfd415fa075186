"""The audit of decisions (reference §19), on both backends: ``GET /v1/audit`` pages the
caller's records (of their runs, or made by them) in ``seq`` order with ``more`` and
``next``, and refuses a malformed cursor with 422 ``invalid_input``; a record is never
changed, not even by SQL on the store's own connection; the reaper's pass purges records
past ``TETHER_AUDIT_RETENTION_DAYS`` and keeps the younger ones, which outlive the purge
of their runs.

No worker runs here: the engine carries runs with ``ask`` and ``run_until_stop``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from deciders_api import DecidersApi, serving
from waiting import until

from tether import Engine, StopKind
from tether.errors import NotFound

DAY_S = 86_400.0


async def _decided_and_cancelled(api: DecidersApi) -> tuple[str, str]:
    """dana's run approved by boss (recorded) then ann (decided), and eve's run approved
    by eve (recorded) then cancelled by her: their ids."""
    run_id, [token] = await api.suspended()
    for person in ("boss", "ann"):
        assert (await api.decide(token, person)).status_code == 200
    other, [own] = await api.suspended("eve")
    assert (await api.decide(own, "eve")).status_code == 200
    cancel = await api.client.post(
        f"/v1/runs/{other}/cancel", headers={"Authorization": "Bearer key-of-eve"}
    )
    assert cancel.status_code == 200, cancel.text
    return run_id, other


def _kinds(page: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [(r["kind"], r["user_id"], r["by"]) for r in page["items"]]


async def test_the_audit_lists_the_callers_records_page_by_page(db_url: str) -> None:
    async with serving(db_url, "pay") as api:
        run_id, other = await _decided_and_cancelled(api)
        mine = await api.get("/v1/audit", "dana")
        assert _kinds(mine) == [("recorded", "dana", "boss"), ("decided", "dana", "ann")]
        assert (mine["more"], mine["after"], mine["limit"], mine["next"]) == (
            False,
            None,
            100,
            None,
        )
        first = mine["items"][0]
        assert first == {
            "seq": first["seq"],
            "at": first["at"],
            "kind": "recorded",
            "run_id": run_id,
            "root_run_id": run_id,
            "user_id": "dana",
            "by": "boss",
            "tool": "pay",
            "tool_call_id": first["tool_call_id"],
            "digest": first["digest"],
            "decision": "approve",
            "reason": None,
            "outcome": "recorded",
        }
        assert datetime.fromisoformat(first["at"]).tzinfo is not None
        assert len(first["digest"]) == 64 and mine["items"][1]["outcome"] == "approved"
        # Those who decided see what they did; eve sees her own run; lead, nothing.
        assert _kinds(await api.get("/v1/audit", "boss")) == [("recorded", "dana", "boss")]
        assert _kinds(await api.get("/v1/audit", "ann")) == [("decided", "dana", "ann")]
        theirs = await api.get("/v1/audit", "eve")
        assert _kinds(theirs) == [("recorded", "eve", "eve"), ("cancelled", "eve", "eve")]
        assert {r["run_id"] for r in theirs["items"]} == {other}
        assert (await api.get("/v1/audit", "lead"))["items"] == []

        page = await api.get("/v1/audit?limit=1", "dana")
        assert _kinds(page) == [("recorded", "dana", "boss")] and page["more"] is True
        assert page["after"] == first["seq"]
        assert page["next"] == f"/v1/audit?after={first['seq']}&limit=1"
        last = await api.get(page["next"], "dana")
        assert _kinds(last) == [("decided", "dana", "ann")]
        assert (last["more"], last["after"], last["next"]) == (False, None, None)
        assert (await api.get(f"/v1/audit?after={last['items'][0]['seq']}", "dana")) == {
            "items": [],
            "more": False,
            "after": None,
            "limit": 100,
            "next": None,
        }


async def test_a_malformed_cursor_is_invalid_input_and_changes_nothing(db_url: str) -> None:
    async with serving(db_url, "pay") as api:
        await _decided_and_cancelled(api)
        before = [r.to_json() for r in await api.engine.operator.audit_records()]
        for query in (
            "after=-1",
            "after=abc",
            "after=1.5",
            f"after={2**63}",
            "after=",
            "limit=0",
            "limit=1001",
            "limit=x",
        ):
            response = await api.client.get(
                f"/v1/audit?{query}", headers={"Authorization": "Bearer key-of-dana"}
            )
            assert response.status_code == 422, (query, response.text)
            body = response.json()
            assert (body["ok"], body["error"]) == (False, "invalid_input"), query
            assert body["message"], query
        after = [r.to_json() for r in await api.engine.operator.audit_records()]
        assert after == before


def _sql(engine: Engine, statement: str, **params: Any) -> None:
    with engine.runner.store.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


async def test_an_audit_record_is_never_changed_not_even_by_sql(db_url: str) -> None:
    async with serving(db_url, "pay") as api:
        await _decided_and_cancelled(api)
        before = [r.to_json() for r in await api.engine.operator.audit_records()]
        seq = before[0]["seq"]
        for statement in (
            "UPDATE audit SET reason = 'rewritten' WHERE seq = :seq",
            "UPDATE audit SET at = at - 1000 WHERE seq = :seq",
            "UPDATE audit SET kind = 'decided', outcome = 'approved' WHERE seq = :seq",
            "UPDATE audit SET by = NULL",
        ):
            with pytest.raises(sa.exc.DBAPIError, match="audit records are never changed"):
                _sql(api.engine, statement, seq=seq)
        after = [r.to_json() for r in await api.engine.operator.audit_records()]
        assert after == before and len(after) == 4


async def test_records_outlive_their_runs_and_go_after_their_own_retention(db_url: str) -> None:
    # Runs are kept a few milliseconds, audit records a day.
    async with serving(db_url, "pay", retention_days=1e-7, audit_retention_days=1.0) as api:
        run_id, [token] = await api.suspended()
        for person in ("boss", "ann"):
            assert (await api.decide(token, person)).status_code == 200
        assert (await api.engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
        now = api.engine.runner.store.now()
        # Records written before: two days old (past the retention), half a day (kept).
        insert = (
            "INSERT INTO audit (at, kind, user_id, by, outcome) "
            "VALUES (:at, 'continued', 'dana', 'boss', :outcome)"
        )
        _sql(api.engine, insert, at=now - 2 * DAY_S, outcome="old")
        _sql(api.engine, insert, at=now - DAY_S / 2, outcome="young")

        async def purged() -> bool:
            await api.engine.operator.reap()
            try:
                await api.engine.get_run(run_id)
            except NotFound:
                return True
            return False

        await until(purged, what="the run's purge")
        kept = [(r.kind, r.values["outcome"]) for r in await api.engine.audit("dana")]
        assert kept == [("recorded", "recorded"), ("decided", "approved"), ("continued", "young")]
        assert all(r.values["run_id"] == run_id for r in list(await api.engine.audit("dana"))[:2])
        again = await api.engine.operator.reap()  # safe twice: nothing more goes
        assert again.purged == 0
        assert len(await api.engine.operator.audit_records()) == 3
