"""The audit of decisions (reference §19), on both backends, through the Python API: each
migration, continuation grant, cancellation and decision leaves one audit record naming
the run, its root, its owner and who acted, written with what it records; a viewer sees
the records of their runs and those they made, in ``seq`` order, paged; a record is never
changed (the database refuses an UPDATE)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
import versioned

from tether import StopKind
from tether.errors import InvalidInput


async def test_a_migration_a_grant_and_a_cancellation_are_audited(db_url: str) -> None:
    old = versioned.engine(db_url, versioned.v1())
    new = versioned.engine(db_url, versioned.v2())
    try:
        halted = await old.ask("dana", "hello", limits={"max_steps": 1})
        assert halted.kind is StopKind.HALTED
        await old.continue_run(halted.run_id, "dana", limits={"max_steps": 9}, why="more")
        moving = await old.start_run("dana", "hello")
        await new.runner.registration().join()  # a live worker of v2
        await new.operator.move_run(moving.id, "kit@v2", user="ops", why="deploy 42")
        await new.cancel_run(moving.id, "dana")

        records = list(await new.audit("dana"))
        shown = [
            (r.kind, r.values["run_id"], r.values["by"], r.values["reason"], r.values["outcome"])
            for r in records
        ]
        assert shown == [
            ("continued", halted.run_id, "dana", "more", "resumed"),
            ("migrated", moving.id, "ops", "deploy 42", "kit@v1 -> kit@v2"),
            ("cancelled", moving.id, "dana", None, "cancelled"),
        ]
        assert all(r.values["user_id"] == "dana" for r in records)
        assert [r.values["root_run_id"] for r in records] == [r.values["run_id"] for r in records]
        assert [r.seq for r in records] == sorted(r.seq for r in records)
        assert [r.kind for r in await new.audit("ops")] == ["migrated"]  # what ops did
        assert list(await new.audit("eve")) == []

        first = await new.audit("dana", limit=2)
        assert len(first) == 2 and first.more and first.after == records[1].seq
        rest = await new.audit("dana", after=first.after or 0)
        assert [r.seq for r in rest] == [records[2].seq] and not rest.more
        for bad in ({"after": -1}, {"limit": 0}, {"limit": 1001}):
            with pytest.raises(InvalidInput):
                await new.audit("dana", **bad)
    finally:
        old.close()
        new.close()


async def test_an_audit_record_is_never_changed(db_url: str) -> None:
    engine = versioned.engine(db_url, versioned.v1())
    try:
        run = await engine.start_run("dana", "hello")
        await engine.cancel_run(run.id, "dana")
        [record] = list(await engine.audit("dana"))
        store = engine.runner.store
        with pytest.raises(sa.exc.DBAPIError, match="audit records are never changed"):
            with store.engine.begin() as conn:
                conn.execute(
                    sa.text("UPDATE audit SET by = 'mallory' WHERE seq = :s"), {"s": record.seq}
                )
        assert list(await engine.audit("dana")) == [record]
    finally:
        engine.close()
