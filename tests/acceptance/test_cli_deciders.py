"""Who decides (reference §19) from the command line, in real processes on both backends:
``tether audit export`` writes every record as JSON lines in ``seq`` order, filtered by
``--user`` and ``--since`` (an ISO time, UTC without an offset), and refuses a malformed
``--since`` with one line naming ``invalid_input``; ``tether approve`` of an approval
toward a quorum prints the count, the same person again is ``already_decided``;
``tether approvals list`` shows a quorum's approvals so far and an escalation, which
``tether reap`` reports.

The runs are made in this process (the deciders' test agent), then closed: only the
commands touch the database while they run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import deciders
import downstream
import processes
from waiting import until

from tether import Engine, MemoryNotifier, StopKind
from tether.config import Settings

AGENT = "deciders:agent"


def _engine(url: str, tool: str) -> Engine:
    for person in ("ann", "bob"):
        deciders.join(person, "finance")
    return Engine(
        agent=deciders.agent(),
        model=deciders.script(tool),
        settings=Settings(database_url=url),
        notifier=MemoryNotifier(),
    )


async def _suspended(engine: Engine, user: str = deciders.OWNER) -> tuple[str, str]:
    outcome = await engine.ask(user, "pay them")
    assert outcome.kind is StopKind.SUSPENDED and outcome.notice is not None
    return outcome.run_id, outcome.notice.token


def _tether(url: str, *args: str) -> Any:
    return processes.tether(*args, env=processes.tether_env(url), agent=AGENT)


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def _iso(epoch: float, *, naive: bool = False) -> str:
    when = datetime.fromtimestamp(epoch, UTC)
    return (when.replace(tzinfo=None) if naive else when).isoformat()


async def test_audit_export_writes_every_record_as_json_lines_filtered_by_user_and_time(
    db_url: str,
) -> None:
    engine = _engine(db_url, "pay")
    try:
        _, token = await _suspended(engine)
        for person in ("boss", "ann"):
            await engine.resume_after_confirmation(token, "approve", person)
        other, own = await _suspended(engine, "eve")
        await engine.resume_after_confirmation(own, "approve", "eve")
        await engine.cancel_run(other, "eve")
        records = list(await engine.operator.audit_records())
    finally:
        engine.close()
    assert [(r.kind, r.values["user_id"]) for r in records] == [
        ("recorded", "dana"),
        ("decided", "dana"),
        ("recorded", "eve"),
        ("cancelled", "eve"),
    ]
    every = _tether(db_url, "audit", "export")
    assert every.returncode == 0, every.stderr[-3000:]
    assert _lines(every.stdout) == [r.to_json() for r in records]  # in seq order

    eves = _tether(db_url, "audit", "export", "--user", "eve")
    assert eves.returncode == 0, eves.stderr[-3000:]
    assert _lines(eves.stdout) == [r.to_json() for r in records[2:]]

    # At or after a time between two records: with an offset, and without one (UTC).
    between = (records[0].at + records[1].at) / 2
    since = _tether(db_url, "audit", "export", "--since", _iso(between))
    assert since.returncode == 0, since.stderr[-3000:]
    assert [r["seq"] for r in _lines(since.stdout)] == [r.seq for r in records[1:]]
    later = (records[1].at + records[2].at) / 2
    naive = _tether(db_url, "audit", "export", "--since", _iso(later, naive=True), "--user", "eve")
    assert naive.returncode == 0, naive.stderr[-3000:]
    assert [r["seq"] for r in _lines(naive.stdout)] == [r.seq for r in records[2:]]

    for bad in ("yesterday", "2026-13-01", "12/06/2026"):
        refused = _tether(db_url, "audit", "export", "--since", bad)
        assert refused.returncode == 1, bad
        assert refused.stdout == ""
        (line,) = refused.stderr.strip().splitlines()
        assert "invalid_input" in line and "--since" in line, line


async def test_approve_prints_a_quorums_count_and_approvals_list_shows_who_approved(
    db_url: str,
) -> None:
    engine = _engine(db_url, "pay")
    try:
        run_id, token = await _suspended(engine)
    finally:
        engine.close()
    first = _tether(db_url, "approve", token, "--as", "boss")
    assert first.returncode == 0, first.stderr[-3000:]
    answer = json.loads(first.stdout)
    assert (answer["outcome"], answer["approvals"], answer["quorum"]) == ("recorded", 1, 2)
    assert "1 of 2 approvals" in first.stderr
    assert downstream.effects() == []

    listed = _tether(db_url, "approvals", "list")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert run_id in listed.stdout and "1 of 2 approvals: boss" in listed.stdout
    as_json = _tether(db_url, "approvals", "list", "--json")
    (item,) = json.loads(as_json.stdout)["items"]
    assert (item["quorum"], [a["by"] for a in item["approvals"]]) == (2, ["boss"])
    assert item["suspended_at"] is not None and item["escalated_at"] is None

    again = _tether(db_url, "approve", token, "--as", "boss")
    assert again.returncode == 1 and "already_decided" in again.stderr
    last = _tether(db_url, "approve", "--run", run_id, "--as", "ann")
    assert last.returncode == 0, last.stderr[-3000:]
    assert json.loads(last.stdout)["outcome"] == "executed"
    assert "approvals" not in last.stderr and len(downstream.effects()) == 1


async def test_reap_reports_an_escalation_and_approvals_list_shows_it(db_url: str) -> None:
    engine = _engine(db_url, "page")
    try:
        run_id, _ = await _suspended(engine)
    finally:
        engine.close()
    before = _tether(db_url, "approvals", "list")
    assert run_id in before.stdout and "escalated" not in before.stdout

    def escalated() -> bool:
        done = _tether(db_url, "reap")
        assert done.returncode == 0, done.stderr[-3000:]
        return run_id in json.loads(done.stdout)["escalated"]

    await until(escalated, timeout=120, interval=0.5, what="the escalation by tether reap")
    after = _tether(db_url, "approvals", "list")
    assert after.returncode == 0, after.stderr[-3000:]
    (row,) = [line for line in after.stdout.splitlines() if "escalated" in line]
    assert row.split()[0] == "escalated" and "at 20" in row
    assert "approvals" not in after.stdout  # one person decides it: no quorum shown
