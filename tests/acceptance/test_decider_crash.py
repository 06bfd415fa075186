"""Crash safety of who decides (reference §19, §7) with real processes, on both backends.

A ``tether`` process (``--agent deciders:agent``) is exited hard (``os._exit(137)``) at
the two gaps a quorum and an escalation add, and other processes go on:

- ``after_approval_recorded``: ``tether approve --as boss`` dies once the first approval
  of a call waiting on two is committed. The approval still counts (boss again is
  ``already_decided``); a reaper, another process, escalates the still-undecided call once;
  the second approval, from a third process with the escalation's token, carries the call
  out once.
- ``after_escalated``: ``tether reap`` dies once an escalation is committed, before its
  notice went out. The next reaper does not escalate the call again (one ``escalated``
  event, one audit record) but sends the notice once its delivery window has passed, with
  a fresh second token, which lets a person it was escalated to decide the call.

Everything is counted from the store, the webhook and the downstream; the tests wait by
polling the database's clock, never by sleeping.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import deciders
import downstream
import inprocess
import processes
import pytest
import webhooks
from waiting import poll_until, run_sync

from tether import Engine, MemoryNotifier, StopKind
from tether.errors import AlreadyDecided
from tether.runs import PendingCall
from tether.store import Store

AGENT = "deciders:agent"
NOTICE_TIMEOUT_S = 0.5  # the reapers' delivery window: a lost notice goes out after it


@dataclass
class Kit:
    """A run of ``deciders.agent`` suspended on one call, a store, and a webhook."""

    url: str
    engine: Engine
    store: Store
    hook: webhooks.NoticeReceiver
    run_id: str
    token: str

    def tether(self, *args: str, **extra: str) -> Any:
        """A ``tether`` process on the test's database whose notices go to the webhook
        (lost ones are re-issued after ``NOTICE_TIMEOUT_S``); its completed process."""
        env = processes.tether_env(
            self.url,
            TETHER_WEBHOOK_URL=self.hook.url,
            TETHER_NOTICE_TIMEOUT_S=str(NOTICE_TIMEOUT_S),
            **extra,
        )
        return processes.tether(*args, env=env, agent=AGENT)

    def call(self) -> PendingCall:
        run = self.store.get_run(self.run_id)
        assert run is not None
        [call] = run.pending_calls
        return call

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e.data for e in self.store.events(self.run_id) if e.kind == kind]

    def audit(self) -> list[tuple[str, str | None]]:
        records, _ = self.store.audit_records(after=0, limit=100)
        return [(r.kind, r.values["by"]) for r in records if r.values["run_id"] == self.run_id]

    def escalated_notices(self) -> list[dict[str, Any]]:
        return [n for n in self.hook.notices if n["run_id"] == self.run_id and n["escalated"]]

    def due(self) -> None:
        """Until the call's escalation is due by the database's clock."""
        after_s = deciders.ESCALATE_AFTER_MIN * 60
        since = self.call().suspended_at or 0
        poll_until(lambda: self.store.now() - since > after_s, what="the escalation due")

    def finish(self) -> None:
        """Carry the run, handed back once its call was carried out, to its answer."""
        assert self.engine.sync.run_until_stop(self.run_id).kind is StopKind.ANSWERED


def _kit(url: str, tool: str) -> Iterator[Kit]:
    deciders.join("ann", "finance")
    deciders.join("olga", "oncall")
    notifier = MemoryNotifier()  # the suspension's own notice, delivered in process
    engine = inprocess.engine_for(
        url,
        deciders.agent(),
        deciders.script(tool),
        notifier=notifier,
        heartbeat_timeout_s=0.3,
        notice_timeout_s=NOTICE_TIMEOUT_S,
    )
    store = Store(url)
    try:
        with webhooks.receiver() as hook:
            outcome = engine.sync.ask(deciders.OWNER, f"{tool} them")
            assert outcome.kind is StopKind.SUSPENDED and outcome.notice is not None
            yield Kit(url, engine, store, hook, outcome.run_id, outcome.notice.token)
    finally:
        store.close()
        engine.close()


@pytest.fixture
def signing(db_url: str) -> Iterator[Kit]:
    """A call of ``sign``: two approvals, escalated when undecided."""
    yield from _kit(db_url, "sign")


@pytest.fixture
def paging(db_url: str) -> Iterator[Kit]:
    """A call of ``page``: escalated when undecided."""
    yield from _kit(db_url, "page")


def test_an_approval_recorded_before_a_crash_counts_and_the_call_escalates_once(
    signing: Kit,
) -> None:
    kit = signing
    crashed = kit.tether(
        "approve", kit.token, "--as", "boss", TETHER_FAILPOINTS="after_approval_recorded=crash"
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    # The approval was committed before the process died: it is shown and counted.
    assert [a["by"] for a in kit.call().approvals] == ["boss"]
    assert [e["approvals"] for e in kit.events("approval_recorded")] == [1]
    assert kit.audit() == [("recorded", "boss")]
    with pytest.raises(AlreadyDecided):  # boss counts once, crash or not
        kit.engine.sync.resume_after_confirmation(kit.token, "approve", "boss")
    assert downstream.effects() == []

    kit.due()
    reaped = kit.tether("reap")  # the escalation pass, in another process
    assert reaped.returncode == 0, reaped.stderr[-3000:]
    assert json.loads(reaped.stdout)["escalated"] == [kit.run_id]
    assert run_sync(kit.engine.operator.reap()).escalated == []  # once, however many passes
    [notice] = kit.escalated_notices()
    assert notice["quorum"] == 2 and set(notice["escalate_to"]) == {"group:oncall", "lead"}
    assert notice["token"] != kit.token
    assert [a["by"] for a in kit.call().approvals] == ["boss"]  # still counted

    second = kit.tether("approve", str(notice["token"]), "--as", "lead")
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads(second.stdout)["outcome"] == "executed"
    kit.finish()
    assert [tool for _, tool, _ in downstream.effects()] == ["sign"]  # carried out once
    assert len(kit.events("escalated")) == 1
    assert kit.audit() == [("recorded", "boss"), ("escalated", None), ("decided", "lead")]


def test_an_escalation_whose_notice_died_with_its_process_is_notified_once_more(
    paging: Kit,
) -> None:
    kit = paging
    kit.due()
    crashed = kit.tether("reap", TETHER_FAILPOINTS="after_escalated:page=crash")
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    escalated_at = kit.call().escalated_at
    assert escalated_at is not None  # durable, and its notice never went out
    assert kit.escalated_notices() == []
    assert len(kit.events("escalated")) == 1 and kit.audit() == [("escalated", None)]

    poll_until(
        lambda: kit.store.now() - escalated_at > NOTICE_TIMEOUT_S + 0.05,
        what="the lost escalation notice's window passed",
    )
    reaped = kit.tether("reap")
    assert reaped.returncode == 0, reaped.stderr[-3000:]
    report = json.loads(reaped.stdout)
    assert report["escalated"] == [] and report["notices_reissued"] == [kit.run_id]
    [notice] = kit.escalated_notices()
    assert notice["token"] != kit.token
    assert set(notice["escalate_to"]) == {"group:oncall", "lead"}
    # Not escalated twice, and a notice delivered is not sent again (its window passed).
    assert kit.call().escalated_at == escalated_at
    assert len(kit.events("escalated")) == 1 and kit.audit() == [("escalated", None)]
    again = run_sync(kit.engine.operator.reap())
    assert again.escalated == [] and again.notices_reissued == []
    assert len(kit.escalated_notices()) == 1

    decided = kit.tether("approve", str(notice["token"]), "--as", "olga")  # of group:oncall
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert json.loads(decided.stdout)["outcome"] == "executed"
    kit.finish()
    assert [tool for _, tool, _ in downstream.effects()] == ["page"]
    assert kit.audit() == [("escalated", None), ("decided", "olga")]
