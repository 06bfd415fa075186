"""What a claim costs while many runs wait under ``TETHER_MAX_ACTIVE_PER_USER`` (reference
§17), on PostgreSQL and on SQLite, against a claim with no cap and no run waiting.

Three rounds, each on a fresh database, each timing ``--claims`` claims (``Store.claim_ready``:
one conditional UPDATE that picks and claims, and its COMMIT), each claimed run cancelled
at once so the next claim meets the same queue:

- baseline: no cap, one ready run at each claim (created just before it, not timed);
- capped: ``--runs`` (10,000) waiting runs of ``--users`` (100) users, cap ``--cap``, the
  fleet carrying ``--slots`` (16) runs, ``--cap`` for each of the first users; the waiting
  runs created in two orders: ``interleaved`` (the users' runs arriving together) and
  ``blocks`` (one user's whole batch after another's, the users at the cap first: the
  claim's cheap look at the first ready runs finds only theirs and compares every
  user's best run instead);
- late user: every user carrying ``--cap`` runs, then one run of a new user arrives last
  and one slot frees: how many claims it takes before the new user's run is claimed
  (the goal: the first, within one claim round).

Prints the median and p99 of each, their ratios (goal: capped at most 1.2 times baseline), and the
late user's claim count. Figures, not assertions.

Run: .venv/bin/python benchmarks/claims.py [--runs 10000] [--users 100] [--claims 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sqlalchemy as sa  # noqa: E402
from compare_common import fresh_database  # noqa: E402

from tether.budget import Limits  # noqa: E402
from tether.store import Store, upgrade  # noqa: E402
from tether.store.schema import runs  # noqa: E402


def _rows(n: int, users: int, *, blocks: bool) -> list[dict[str, object]]:
    """``n`` ready runs of ``users`` users, in one user's block after another's or
    interleaved, each a little younger than the one before."""
    now = time.time()
    per_user = n // users
    return [
        {
            "id": uuid.uuid4().hex,
            "user_id": f"user{(i // per_user if blocks else i % users):03d}",
            "question": "q",
            "route": {},
            "state": "running",
            "thread_id": None,
            "max_steps": 10,
            "max_spend_usd": 1.0,
            "max_tool_calls": 10,
            "max_elapsed_ms": 60_000,
            "scope_snapshot": {},
            "scope_resolved_at": now,
            "versions": {},
            "agent_version": "bench@1",
            "started_at": now,
            "updated_at": now + i * 1e-6,
        }
        for i in range(n)
    ]


def _one(store: Store, user: str = "solo") -> str:
    run_id = uuid.uuid4().hex
    store.create_run(
        run_id=run_id,
        user_id=user,
        question="q",
        route={},
        limits=Limits(),
        scope={},
        versions={},
        agent_version="bench@1",
        messages=[],
    )
    return run_id


def _timed_claims(store: Store, n: int, cap: int | None, *, refill: bool) -> list[float]:
    """``n`` claims, each claimed run cancelled at once (untimed)."""
    took: list[float] = []
    for i in range(n):
        if refill:
            _one(store)
        start = time.perf_counter()
        run = store.claim_ready(f"w{i}", cap=cap)
        took.append(time.perf_counter() - start)
        assert run is not None, "nothing to claim"
        store.cancel(run_id=run.id, user_id=run.user_id, by="bench")
    return took


def _carry(store: Store, user: str, n: int) -> None:
    """Give ``user`` ``n`` carried runs (claimed under a busy owner)."""
    for _ in range(n):
        run_id = _one(store, user)
        assert store.claim_ready("busy", run_id) is not None


def _summary(took: list[float]) -> tuple[float, float]:
    ordered = sorted(took)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.99) - 1] * 1e3


def _capped(store: Store, args: argparse.Namespace, *, blocks: bool) -> list[float]:
    with store.begin() as conn:
        conn.execute(runs.delete())
        conn.execute(runs.insert(), _rows(args.runs, args.users, blocks=blocks))
    for u in range(args.slots // args.cap):
        _carry(store, f"user{u:03d}", args.cap)
    return _timed_claims(store, args.claims, args.cap, refill=False)


def _late(store: Store, args: argparse.Namespace) -> int | None:
    """Everyone at the cap, a new user's run arrives, a slot frees: the claims it takes."""
    for u in range(args.slots // args.cap, args.users):
        _carry(store, f"user{u:03d}", args.cap)
    late = _one(store, "late")
    with store.engine.connect() as conn:
        one = conn.execute(
            sa.select(runs.c.id).where(runs.c.user_id == "user000", runs.c.owner == "busy")
        ).first()
    assert one is not None
    store.cancel(run_id=one.id, user_id="user000", by="bench")
    for claims in range(1, 51):
        run = store.claim_ready("w-late", cap=args.cap)
        if run is None:
            return None
        if run.id == late:
            return claims
    return None


def _round(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_database(backend) as db:
        store = Store(db.url)
        upgrade(store.engine)
        got: dict[str, Any] = {
            "baseline": _summary(_timed_claims(store, args.claims, None, refill=True))
        }
        got["interleaved"] = _summary(_capped(store, args, blocks=False))
        got["blocks"] = _summary(_capped(store, args, blocks=True))
        got["late"] = _late(store, args)
        store.close()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--cap", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--backends", default="postgresql,sqlite")
    args = parser.parse_args()
    print(
        f"{args.runs} waiting runs of {args.users} users, cap {args.cap}, "
        f"{args.slots} carried, {args.claims} claims"
    )
    print(f"{'backend':<11} {'round':<12} {'median ms':>10} {'p99 ms':>8} {'ratio':>12}")
    for backend in args.backends.split(","):
        got = _round(backend, args)
        base_med, base_p99 = got["baseline"]
        print(f"{backend:<11} {'baseline':<12} {base_med:>10.3f} {base_p99:>8.3f}")
        for order in ("interleaved", "blocks"):
            med, p99 = got[order]
            ratio = f"{med / base_med:.2f}/{p99 / base_p99:.2f}"
            print(f"{backend:<11} {order:<12} {med:>10.3f} {p99:>8.3f} {ratio:>12}")
        late = got["late"]
        print(f"{backend:<11} late user's run claimed by claim no. {late} after a slot freed")


if __name__ == "__main__":
    main()
