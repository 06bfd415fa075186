"""A crash in the middle of an edited approval, with real processes (reference §9, §7): the
approval runs as a ``tether approve`` subprocess that a failpoint exits hard; a
``tether reap`` subprocess recovers the run; the edited call runs once, under the call's
one key, and the model's original arguments never run."""

from __future__ import annotations

import json

import downstream
import inprocess
import processes
import pytest
from waiting import poll_until, run_sync

from tether import MemoryNotifier, StopKind
from tether.store import Store


@pytest.mark.parametrize(
    ("failpoint", "ran_before_the_crash"),
    [("after_claim=crash", []), ("after_tool_commit:send=crash", ["c"])],
)
def test_a_crash_in_an_edited_approval_recovers_and_runs_the_edited_call_once(
    db_url: str, failpoint: str, ran_before_the_crash: list[str]
) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    run_id = engine.sync.ask("dana", "send b").run_id
    token = notifier.last(run_id).token
    shown = run_sync(engine.preview_approval(token, "dana", {"item": "c"}))
    engine.close()
    edit = ("--arguments", '{"item": "c"}', "--digest", str(shown.digest))

    crashed = processes.tether(
        "approve", token, *edit, env=processes.tether_env(db_url, TETHER_FAILPOINTS=failpoint)
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    assert [item for _, _, item in downstream.effects()] == ran_before_the_crash

    store = Store(db_url)
    try:

        def stale() -> bool:
            run = store.get_run(run_id)
            assert run is not None and run.heartbeat_at is not None
            return store.now() - run.heartbeat_at > 0.35

        poll_until(stale, what="the crashed approval's lease to go stale")
        reaped = processes.tether("reap", env=processes.tether_env(db_url))
        assert reaped.returncode == 0, reaped.stderr
        recovered = store.get_run(run_id)
        assert recovered is not None and recovered.recovery_attempts == 1
    finally:
        store.close()

    finisher = inprocess.engine(db_url, script_name="send")
    try:
        assert finisher.sync.run_until_stop(run_id).kind is StopKind.ANSWERED
        view = finisher.sync.get_run(run_id)
        ledger = run_sync(finisher.ledger(run_id))
    finally:
        finisher.close()
    call_id = ledger[0].tool_call_id
    # The edited call ran exactly once, under the call's one key; "b" never ran.
    assert downstream.effects() == [(f"{run_id}:{call_id}", "send", "c")]
    result = json.loads(next(m for m in view.messages if m.get("role") == "tool")["content"])
    assert result == {
        "edited_by_user": {"arguments": {"item": "c"}},
        "result": {"done": "send", "item": "c"},
    }
    assert ledger[0].arguments == {"item": "b"} and ledger[0].edited_arguments == {"item": "c"}
