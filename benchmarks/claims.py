"""What a claim costs while many runs wait (reference §13), with the defaults (no cap: the
fair pick, the user carrying the fewest runs first) and under ``TETHER_MAX_ACTIVE_PER_USER``,
on PostgreSQL and on SQLite, against a claim with no run waiting but the one it takes.

Rounds on a fresh database each, each timing ``--claims`` claims (``Store.claim_ready``, or
``Store.claim_waiting`` for a batch: one conditional UPDATE that picks and claims, and its
COMMIT), each claimed run cancelled at once so the next claim meets the same queue:

- baseline: one ready run at each claim (created just before it, not timed); for
  batches, ``--batch`` (32) ready runs of one user at each claim;
- fair: no cap, ``--runs`` (10,000) waiting runs of ``--users`` (100) users while the
  fleet carries ``--slots`` (16), ``--cap`` for each of the first users, the runs
  ``interleaved`` or in ``blocks`` as below; claims of one run, and of ``--batch``;
- late user, no cap: ``--runs`` waiting runs of one user, who carries ``--slots``, then
  one run of another user arrives last: which claim of ``--batch`` takes it (the goal:
  the first);
- capped: ``--runs`` (10,000) waiting runs of ``--users`` (100) users, cap ``--cap``, the
  fleet carrying ``--slots`` (16) runs, ``--cap`` for each of the first users; the waiting
  runs created in two orders: ``interleaved`` (the users' runs arriving together) and
  ``blocks`` (one user's whole batch after another's, the users at the cap first: the
  claim's cheap look at the first ready runs finds only theirs and compares every
  user's best run instead);
- late user: every user carrying ``--cap`` runs, then one run of a new user arrives last
  and one slot frees: how many claims it takes before the new user's run is claimed
  (the goal: the first, within one claim round).

On PostgreSQL the tables are analysed once filled (as autovacuum would have done). Prints
the median and p99 of each, their ratios to the baseline of the same size (goal: at
most 1.2), and the late users' claim counts. Figures, not assertions.

``--no-flush``: commits do not wait for the disk (PostgreSQL's ``synchronous_commit``
off for the benchmark's connections, the SQLite file in ``/dev/shm``), so the figures are
the claim's own work, on a machine whose disk other work shares (there a flush alone
varies by milliseconds). Never how tether runs.

Run: .venv/bin/python benchmarks/claims.py [--runs 10000] [--users 100] [--claims 300]
[--no-flush]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
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
from tether.store.sql.schema import runs  # noqa: E402


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


def _timed_claims(
    store: Store, n: int, cap: int | None, *, refill: bool, batch: int = 1
) -> list[float]:
    """``n`` claims of ``batch`` runs, each claimed run cancelled at once (untimed)."""
    took: list[float] = []
    for i in range(n):
        if refill:
            for _ in range(batch):
                _one(store)
        start = time.perf_counter()
        claimed = store.claim_waiting(f"w{i}", batch, cap=cap)
        took.append(time.perf_counter() - start)
        assert len(claimed) == batch, "nothing to claim"
        for run in claimed:
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


def _analyzed(store: Store) -> None:
    """PostgreSQL's statistics of the tables just filled, as autovacuum would have them
    after so many rows (this machine's server runs with it off): the planner's picture of
    a deployment, not of an empty table."""
    if store.dialect.name == "postgresql":
        with store.begin() as conn:
            conn.exec_driver_sql("ANALYZE runs")
            conn.exec_driver_sql("ANALYZE user_load")


def _queue(store: Store, args: argparse.Namespace, *, blocks: bool) -> None:
    """``--runs`` waiting runs of ``--users`` users, the first users carrying ``--cap``."""
    with store.begin() as conn:
        conn.execute(runs.delete())
        conn.execute(runs.insert(), _rows(args.runs, args.users, blocks=blocks))
    for u in range(args.slots // args.cap):
        _carry(store, f"user{u:03d}", args.cap)
    _analyzed(store)


def _capped(store: Store, args: argparse.Namespace, *, blocks: bool) -> list[float]:
    """The rounds under the cap: claims of one run, ``--cap`` each user at most."""
    _queue(store, args, blocks=blocks)
    return _timed_claims(store, args.claims, args.cap, refill=False)


def _fair(store: Store, args: argparse.Namespace, *, blocks: bool, batch: int) -> list[float]:
    _queue(store, args, blocks=blocks)
    claims = args.claims if batch == 1 else max(1, args.claims // 10)
    return _timed_claims(store, claims, None, refill=False, batch=batch)


def _late_fair(store: Store, args: argparse.Namespace) -> int | None:
    """No cap, ``--runs`` waiting runs of one user who carries ``--slots``, then another
    user's run arriving last: the claim of ``--batch`` that takes it."""
    with store.begin() as conn:
        conn.execute(runs.delete())
        conn.execute(runs.insert(), _rows(args.runs, 1, blocks=True))
    _carry(store, "user000", args.slots)
    _analyzed(store)
    late = _one(store, "late")
    for claims in range(1, args.runs // args.batch + 2):
        taken = store.claim_waiting("w-late", args.batch)
        if not taken:
            return None
        if late in {run.id for run in taken}:
            return claims
    return None


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


def _no_flush(store: Store) -> None:
    """The store's PostgreSQL connections commit without waiting for the disk."""

    @sa.event.listens_for(store.engine, "connect")
    def _asynchronous(dbapi_conn: Any, _record: Any) -> None:
        autocommit, dbapi_conn.autocommit = dbapi_conn.autocommit, True
        dbapi_conn.execute("SET synchronous_commit = off")
        dbapi_conn.autocommit = autocommit

    store.engine.dispose()  # connections opened before the listener go


def _round(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    if args.no_flush and backend == "sqlite" and Path("/dev/shm").is_dir():
        tempfile.tempdir = "/dev/shm"
    with fresh_database(backend) as db:
        store = Store(db.url)
        if args.no_flush and backend == "postgresql":
            _no_flush(store)
        upgrade(store.engine)
        got: dict[str, Any] = {
            "baseline": _summary(_timed_claims(store, args.claims, None, refill=True))
        }
        batches = max(1, args.claims // 10)
        timed = _timed_claims(store, batches, None, refill=True, batch=args.batch)
        got["baseline batch"] = _summary(timed)
        for order in ("interleaved", "blocks"):
            blocks = order == "blocks"
            got[f"fair {order}"] = _summary(_fair(store, args, blocks=blocks, batch=1))
            timed = _fair(store, args, blocks=blocks, batch=args.batch)
            got[f"fair {order} batch"] = _summary(timed)
            got[f"capped {order}"] = _summary(_capped(store, args, blocks=blocks))
        got["late"] = _late(store, args)  # on the queue of the last capped round
        got["late fair"] = _late_fair(store, args)
        store.close()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--cap", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument("--no-flush", action="store_true")
    args = parser.parse_args()
    print(
        f"{args.runs} waiting runs of {args.users} users, cap {args.cap}, "
        f"{args.slots} carried, {args.claims} claims of one ({args.claims // 10} of "
        f"{args.batch}); load average {os.getloadavg()[0]:.1f}"
        + ("; commits not flushed" if args.no_flush else "")
    )
    print(f"{'backend':<11} {'round':<24} {'median ms':>10} {'p99 ms':>8} {'ratio':>10}")
    for backend in args.backends.split(","):
        got = _round(backend, args)
        for name, (med, p99) in ((k, v) for k, v in got.items() if not k.startswith("late")):
            base_med, base_p99 = got["baseline batch" if name.endswith("batch") else "baseline"]
            ratio = (
                "" if name.startswith("baseline") else f"{med / base_med:.2f}/{p99 / base_p99:.2f}"
            )
            print(f"{backend:<11} {name:<24} {med:>10.3f} {p99:>8.3f} {ratio:>10}")
        print(
            f"{backend:<11} no cap: another user's run arriving after one user's "
            f"{args.runs} claimed by claim no. {got['late fair']} of {args.batch}"
        )
        late = got["late"]
        print(f"{backend:<11} cap: late user's run claimed by claim no. {late} after a slot freed")


if __name__ == "__main__":
    main()
