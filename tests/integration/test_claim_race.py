"""Concurrent approvals of one token, on both backends (on PostgreSQL the claim is one
statement): exactly one wins; every other approver gets ``already_resumed`` with the
decision that won, whether it lost in the database (its UPDATE waited on the row lock and
matched nothing) or to a claim in flight in its own process; an expired token claims
nothing for any of them."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import downstream
import inprocess
import pytest
from waiting import poll_until, run_sync, until

from tether import Engine, MemoryNotifier, StopKind
from tether.errors import AlreadyResumed, UnknownOrExpired
from tether.results import ApprovalResult
from tether.store import Store
from tether.store.claims import SuspensionClaim
from tether.tokens import hash_token


async def suspended(url: str, **settings: Any) -> tuple[str, str]:
    """A run suspended on a send that needs confirmation: (run id, token)."""
    notifier = MemoryNotifier()
    setup = inprocess.engine(url, script_name="send", notifier=notifier, **settings)
    try:
        outcome = await setup.ask("dana", "send it")
        assert outcome.kind is StopKind.SUSPENDED
        return outcome.run_id, notifier.last(outcome.run_id).token
    finally:
        setup.close()


def test_one_of_n_concurrent_store_claims_wins_and_the_rest_read_its_decision(
    db_url: str,
) -> None:
    run_id, token = run_sync(suspended(db_url))
    store = Store(db_url)
    claimers = 12
    barrier = threading.Barrier(claimers)

    def claim(i: int) -> SuspensionClaim:
        barrier.wait()
        return store.claim_decision(
            run_id=run_id,
            token_hash=hash_token(token),
            owner=f"approval-{i}",
            decision="approve" if i % 2 else "decline",
            approver=f"approver-{i}",
        )

    try:
        with ThreadPoolExecutor(claimers) as pool:
            claims = list(pool.map(claim, range(claimers)))
        won = [c for c in claims if c.run is not None]
        assert len(won) == 1
        winner = won[0]
        assert winner.decision is not None and winner.run is not None
        assert winner.run.owner == f"approval-{winner.decision.by.split('-')[1]}"
        # Every loser learnt the decision that won, as it was recorded.
        assert all(c.decision == winner.decision for c in claims)
        decided = [e for e in store.events(run_id) if e.kind in ("approved", "declined")]
        assert [e.data["by"] for e in decided] == [winner.decision.by]
        assert store.find_by_token(hash_token(token)) == (None, winner.decision)
    finally:
        store.close()


async def _approve(engine: Engine, token: str, decision: str) -> ApprovalResult | AlreadyResumed:
    try:
        return await engine.resume_after_confirmation(token, decision, "dana")
    except AlreadyResumed as exc:
        return exc


async def test_concurrent_approvals_in_and_across_processes_resume_once(db_url: str) -> None:
    _, token = await suspended(db_url)
    # Three engines (three processes' worth of pools and owners), eight approvers each.
    engines = [inprocess.engine(db_url, script_name="send") for _ in range(3)]
    try:
        calls = [
            _approve(engine, token, "approve" if i % 3 else "decline")
            for engine in engines
            for i in range(8)
        ]
        results = await asyncio.gather(*calls)
        won = [r for r in results if isinstance(r, ApprovalResult)]
        lost = [r for r in results if isinstance(r, AlreadyResumed)]
        assert len(won) == 1 and len(lost) == 23
        (_, recorded) = await asyncio.to_thread(
            engines[0].runner.store.find_by_token, hash_token(token)
        )
        assert recorded is not None and recorded.decision == won[0].decision.value
        expected = {
            "decision": recorded.decision,
            "by": "dana",
            "at": _iso(recorded.at),
            "reason": None,
            "arguments": None,
        }
        assert all(exc.code == "already_resumed" for exc in lost)
        assert all(exc.details["decision"] == expected for exc in lost)
        # The approved send ran at most once, under its one key.
        sends = [key for key, tool, _ in downstream.effects() if tool == "send"]
        assert len(sends) == (1 if recorded.decision == "approve" else 0)
        # A late approver, after the race, is told the same.
        late = await _approve(engines[1], token, "approve")
        assert isinstance(late, AlreadyResumed) and late.details["decision"] == expected
    finally:
        for engine in engines:
            engine.close()


def _iso(at: float) -> str | None:
    from tether.runs import iso

    return iso(at)


async def test_an_expired_token_claims_nothing_for_any_concurrent_approver(db_url: str) -> None:
    ttl_min = 0.005  # 0.3 s
    run_id, token = await suspended(db_url, suspension_ttl_min=ttl_min)
    engine = inprocess.engine(db_url, script_name="send", suspension_ttl_min=ttl_min)
    try:
        run = (await engine.get_run(run_id)).run
        assert run is not None and run.expires_at is not None
        expires_at = run.expires_at

        async def expired() -> bool:
            return await engine.now() > expires_at

        await until(expired)
        results = await asyncio.gather(
            *(engine.resume_after_confirmation(token, "approve", "dana") for _ in range(10)),
            return_exceptions=True,
        )
        assert all(isinstance(r, UnknownOrExpired) for r in results), results
        after = (await engine.get_run(run_id)).run
        assert after is not None and after.state.value == "suspended"  # until the sweep
        found, used = await asyncio.to_thread(engine.runner.store.find_by_token, hash_token(token))
        assert used is None and found is not None  # the token still names its run, unused
        assert dataclasses.replace(found, pending_calls=after.pending_calls) == after
    finally:
        engine.close()


async def test_fifty_approvers_in_one_process_send_one_claim(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    approvers = 50
    _, token = await suspended(db_url)
    engine = inprocess.engine(db_url, script_name="send")
    inflight = engine.runner.services.single_flight
    key = ("claim", hash_token(token))
    claims: list[str] = []
    claim = engine.runner.store.claim_decision

    def counted(store: Store, **kwargs: Any) -> SuspensionClaim:
        # The first claim waits (in its thread) until every other approver waits on it,
        # so that what is counted is the sharing, not the speed of the claim.
        claims.append(kwargs["owner"])
        poll_until(lambda: inflight.sharing(key) == approvers - 1, timeout=30)
        return claim(**kwargs)

    # Bound to the store, as ``hop`` expects of a store method.
    monkeypatch.setattr(
        engine.runner.store, "claim_decision", types.MethodType(counted, engine.runner.store)
    )
    try:
        results = await asyncio.gather(
            *(_approve(engine, token, "approve") for _ in range(approvers))
        )
        assert sum(isinstance(r, ApprovalResult) for r in results) == 1
        assert len(claims) == 1  # the losers never sent an UPDATE that could not win
    finally:
        engine.close()
