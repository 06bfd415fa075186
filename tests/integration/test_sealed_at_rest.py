"""Stored content sealed at rest (reference §20), on both backends: with keys, no column of
any table holds any of a run's content, read as the database holds it, while everything
reads back as it was written and every digest is the one a clear store gives; a rotation
re-seals every value (clear ones too) under the first key and forgets the others; a
process without a key the database needs refuses to start, naming it."""

from __future__ import annotations

import json

import pytest
import sealed
import sqlalchemy as sa

from tether import StopKind
from tether.errors import ConfigError
from tether.sealing import seal_json


async def test_with_keys_no_column_holds_content_and_everything_reads_back(db_url: str) -> None:
    keys = sealed.ring(sealed.entry("k1"))
    engine, notifier = sealed.engine(db_url, keys, "zq7")
    try:
        story = await sealed.story(engine, notifier, "zq7")
        assert sealed.found(engine, sealed.markers("zq7")) == []
        # Everything a reader is given is the content written.
        assert story.run["question"] == "zq7-question"
        assert story.run["messages"][-1]["content"] == "zq7-answer"
        events = dict((kind, data) for kind, data in story.run["events"])
        assert events["declined"]["reason"] == "zq7-no"
        assert [entry[1] for entry in story.run["ledger"]][:2] == [
            {"query": "zq7-arg"},
            {"item": "zq7-item"},
        ]
        records = [r.to_json() for r in await engine.audit("dana")]
        assert "zq7-no" in [r["reason"] for r in records]
    finally:
        engine.close()


async def test_a_digest_binds_the_plaintext_whether_sealed_or_not(db_url: str) -> None:
    clear, notifier = sealed.engine(db_url, None, "dg4")
    try:
        in_clear = await sealed.story(clear, notifier, "dg4")
        # The scan can fail: a clear store holds every marker.
        assert {m for _, m in sealed.found(clear, sealed.markers("dg4"))} == set(
            sealed.markers("dg4")
        )
    finally:
        clear.close()
    keyed, notifier = sealed.engine(db_url, sealed.ring(sealed.entry("k1")), "dg4")
    try:
        in_sealed = await sealed.story(keyed, notifier, "dg4")
    finally:
        keyed.close()
    assert in_sealed.digest == in_clear.digest


async def test_a_rotation_reseals_every_value_and_forgets_the_old_keys(db_url: str) -> None:
    old, new = sealed.entry("k1"), sealed.entry("k2")
    clear, notifier = sealed.engine(db_url, None, "rt1")
    try:
        first = await sealed.story(clear, notifier, "rt1")
    finally:
        clear.close()
    keyed, notifier = sealed.engine(db_url, sealed.ring(old), "rt2")
    try:
        second = await sealed.story(keyed, notifier, "rt2")
        # Turned on over a clear store: the old values stay clear until rotated.
        assert sealed.found(keyed, sealed.markers("rt1")) != []
        done = await keyed.operator.rotate_keys(batch=7)
        assert done.key == "k1" and done.total > 0 and done.retired == []
        assert sealed.found(keyed, sealed.markers("rt1") + sealed.markers("rt2")) == []
        assert await sealed.shown_run(keyed, first.run_id) == first.run
    finally:
        keyed.close()
    both, _ = sealed.engine(db_url, sealed.ring(new, old))
    try:
        done = await both.operator.rotate_keys()
        assert done.key == "k2" and done.retired == ["k1"]
        again = await both.operator.rotate_keys()
        assert again.total == 0 and again.retired == []
    finally:
        both.close()
    only_new, _ = sealed.engine(db_url, sealed.ring(new))
    try:
        assert await sealed.shown_run(only_new, first.run_id) == first.run
        assert await sealed.shown_run(only_new, second.run_id) == second.run
    finally:
        only_new.close()


async def test_a_process_without_a_key_the_store_needs_refuses_to_start(db_url: str) -> None:
    old, new = sealed.entry("k1"), sealed.entry("k2")
    keyed, notifier = sealed.engine(db_url, sealed.ring(old), "nk5")
    try:
        await sealed.story(keyed, notifier, "nk5")
    finally:
        keyed.close()
    for keyring, missing in ((None, "k1"), (sealed.ring(new), "k1")):
        refused, _ = sealed.engine(db_url, keyring)
        try:
            with pytest.raises(ConfigError, match=f"'{missing}'") as error:
                await refused.list_runs("dana")
            assert error.value.code == "invalid_config"
        finally:
            refused.close()
    # The new key listed first, the old one after it: it opens, and seals with the new.
    both, _ = sealed.engine(db_url, sealed.ring(new, old))
    try:
        assert len(list(await both.list_runs("dana"))) == 1
    finally:
        both.close()


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_value_that_looks_sealed_is_stored_and_read_as_written(
    db_url: str, keyed: bool
) -> None:
    keys = sealed.ring(sealed.entry("k1")) if keyed else None
    engine, _ = sealed.engine(db_url, keys)
    try:
        for question in ("tether:sealed:1:k1:AAAA", "tether:sealed:0:x", "tether:sealed:"):
            run = await engine.start_run("dana", question)
            assert (await engine.get_run(run.id)).run.question == question
    finally:
        engine.close()


async def test_a_run_that_meets_a_value_under_a_key_not_listed_fails_naming_it(
    db_url: str,
) -> None:
    engine, _ = sealed.engine(db_url, sealed.ring(sealed.entry("k1")), "mk")
    try:
        run = await engine.start_run("dana", "mk-question")
        # A value sealed with a key no process was given (restored from elsewhere, say).
        foreign = json.dumps(seal_json(sealed.ring(sealed.entry("kx")), {"role": "user"}))
        with engine.runner.store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE run_messages SET message = :m WHERE run_id = :r AND seq = 1"),
                {"m": foreign, "r": run.id},
            )
        outcome = await engine.run_until_stop(run.id)
        assert outcome.kind is StopKind.FAILED and outcome.reason == "error"
        failed = [e.data for e in await engine.events(run.id) if e.kind == "failed"]
        assert len(failed) == 1 and "'kx'" in failed[0]["error"]
        assert failed[0]["code"] == "invalid_config"
    finally:
        engine.close()
