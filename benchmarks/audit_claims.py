"""What the audit record costs the claim of a decision (reference §19), on PostgreSQL and
SQLite: the claim as shipped, which appends the decision's audit record in its own
transaction, against the same claim without that INSERT, measured in the same process on
the same database.

The shape of ``throughput.py``'s claim latency: one token, 50 approvals started together
on one engine (as one ``tether serve`` carries them), each timed from its entry into
``Engine.resume_after_confirmation`` until its claim is decided (the winner's
``Store.claim_decision`` returned the run, a loser got ``already_resumed``, having waited
on the winner's row lock, so the INSERT's cost reaches the losers too). The tool the winner
then runs is not counted.

The baseline is the claim before the audit: for its tokens this process replaces the
store's ``_audit_decision`` (the one call that builds and appends the decision's record
inside the claim's transaction) with a function that does nothing; nothing else differs.
The tokens alternate in blocks of ``--block`` between the two (baseline first), on one
engine and one database, so drift on a shared machine reaches both alike; after the run
the audit must hold one ``decided`` record per audited token and none for the others
(checked). Prints p50 and p99 of every approval and of the winners alone, for each, with
the ratios (goal: audited / baseline <= 1.1 at p50). Figures, not assertions.

Run: .venv/bin/python benchmarks/audit_claims.py [--tokens 200] [--block 5]
     [--concurrent 50] [--backends postgresql,sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_agent  # noqa: E402
from compare_common import fresh_database  # noqa: E402

import tether.store.deciding as deciding_module  # noqa: E402
from tether import Engine, MemoryNotifier  # noqa: E402
from tether.config import Settings  # noqa: E402
from tether.errors import AlreadyResumed  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402
from tether.store.claims import SuspensionClaim  # noqa: E402
from tether.tokens import hash_token  # noqa: E402

GOAL = 1.1
WARM = 3  # tokens each way before the timed ones
# Per claim (baseline, audited): every approval's latency and the winners' (ms).
Timings = dict[str, tuple[list[float], list[float]]]


@contextlib.contextmanager
def without_audit() -> Iterator[None]:
    """The claim as it was before the audit: no record built, no INSERT."""
    shipped = deciding_module._audit_decision
    deciding_module._audit_decision = lambda *args, **kwargs: None
    try:
        yield
    finally:
        deciding_module._audit_decision = shipped


def _timed(store: Store, decided: dict[str, float]) -> None:
    """Record when the winning claim of each token hash was decided (in its thread, as
    the claim returns). Bound to the store, so ``hop`` still finds its executor."""
    claim = store.claim_decision

    def timed(self: Store, **kwargs: Any) -> SuspensionClaim:
        result = claim(**kwargs)
        if result.run is not None:
            decided[kwargs["token_hash"]] = time.perf_counter()
        return result

    setattr(store, "claim_decision", types.MethodType(timed, store))  # noqa: B010


async def _round(
    eng: Engine, notifier: MemoryNotifier, decided: dict[str, float], concurrent: int
) -> tuple[list[float], float]:
    """One token, ``concurrent`` approvals started together: every approval's claim
    latency (ms), and the winner's."""
    outcome = await eng.ask("bench", "publish a")
    token = notifier.last(outcome.run_id).token

    async def approve() -> tuple[float, bool]:
        start = time.perf_counter()
        try:
            await eng.resume_after_confirmation(token, "approve", "bench")
        except AlreadyResumed:
            return (time.perf_counter() - start) * 1000, False
        return (decided[hash_token(token)] - start) * 1000, True

    results = await asyncio.gather(*(approve() for _ in range(concurrent)))
    won = [ms for ms, winner in results if winner]
    if len(won) != 1:
        raise RuntimeError(f"{len(won)} approvals won one token")
    return [ms for ms, _ in results], won[0]


async def _kinds(eng: Engine) -> list[str]:
    """The kind of every audit record, in order."""
    kinds: list[str] = []
    after = 0
    while True:
        page = await eng.operator.audit_records(after=after, limit=1000)
        kinds.extend(r.kind for r in page)
        if page.after is None:
            return kinds
        after = page.after


async def _measure(url: str, args: argparse.Namespace) -> Timings:
    os.environ["BENCH_SCRIPT"] = "publish"
    notifier = MemoryNotifier()
    eng = Engine(
        agent=bench_agent.agent(),
        model=bench_agent.model(),
        settings=Settings(database_url=url),
        notifier=notifier,
    )
    decided: dict[str, float] = {}
    _timed(eng.runner.store, decided)
    got: Timings = {
        "baseline": ([], []),
        "audited": ([], []),
    }
    try:
        for _ in range(WARM):  # warm the pool and the caches, both ways
            with without_audit():
                await _round(eng, notifier, decided, args.concurrent)
            await _round(eng, notifier, decided, args.concurrent)
        before = await _kinds(eng)
        for block in range(args.tokens // args.block):
            name = "baseline" if block % 2 == 0 else "audited"
            every, winners = got[name]
            with without_audit() if name == "baseline" else contextlib.nullcontext():
                for _ in range(args.block):
                    ms, won = await _round(eng, notifier, decided, args.concurrent)
                    every.extend(ms)
                    winners.append(won)
        added = (await _kinds(eng))[len(before) :]
        if added != ["decided"] * len(got["audited"][1]):
            raise RuntimeError(f"{len(added)} audit records for {len(got['audited'][1])} tokens")
    finally:
        await eng.aclose()
    return got


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _backend(backend: str, args: argparse.Namespace) -> Timings:
    with fresh_database(backend) as db:
        store = Store(db.url)
        upgrade(store.engine)
        store.close()
        return asyncio.run(_measure(db.url, args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--backends", default="postgresql,sqlite")
    args = parser.parse_args()
    print(
        f"{args.concurrent} concurrent approvals of one token, {args.tokens} tokens in blocks "
        f"of {args.block} (half of them audited); load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'backend':<11} {'claim':<9} {'every p50':>10} {'p99':>8} {'winner p50':>11} "
        f"{'p99':>8}  ratio p50, p99 (goal: p50 <= {GOAL})"
    )
    for backend in args.backends.split(","):
        got = _backend(backend, args)
        base = got["baseline"][0]
        for name, (every, winners) in got.items():
            p50, p99 = _p(every, 0.5), _p(every, 0.99)
            ratio = ""
            if name != "baseline":
                verdict = "PASS" if p50 / _p(base, 0.5) <= GOAL else "MISS"
                ratio = f"{p50 / _p(base, 0.5):.2f}, {p99 / _p(base, 0.99):.2f}  {verdict}"
            print(
                f"{backend:<11} {name:<9} {p50:>10.2f} {p99:>8.2f} "
                f"{_p(winners, 0.5):>11.2f} {_p(winners, 0.99):>8.2f}  {ratio}"
            )


if __name__ == "__main__":
    main()
