"""The step of two trees of tether side by side: this one's against another checkout's
(``git worktree add --detach ../tether-then COMMIT``), alternated in one sitting.

The workload is ``compare.py``'s (``--steps`` tool steps of 8 KiB results, then the
answer), carried by ``compare_tether.py``'s engine in one process, as ``compare.py``
measures tether: a warm-up run halted at its step limit, then the timed run from
``start_run`` to its answer. Each measurement is a fresh process running one tree's
``src`` and ``benchmarks`` on a fresh database; it prints the wall time and the CPU time
(every thread of the process: the loop and the store's threads) per step. The trees
alternate, this one first, ``--rounds`` times, with ``--runs`` measurements of each in a
round; the medians of each round are printed, then the median of all of each tree's and
their ratio (this tree / the other).

Run: .venv/bin/python benchmarks/step_ab.py ../tether-then [--steps 200] [--runs 3]
    [--rounds 4] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _one(tree: str, backend: str, steps: int) -> None:
    """In a child: one timed run of ``tree`` on a fresh database; prints wall and CPU ms
    per step. The run is driven here rather than by the tree's ``compare_tether._measure``
    (which times the same span, wall only): both trees are then measured by this one code,
    through the two names every tree's ``compare_tether`` has, ``new_engine`` and
    ``limits``."""
    sys.path[:0] = [f"{tree}/src", f"{tree}/benchmarks"]
    import compare_common as common  # the tree's own, as its engine expects
    import compare_tether as subject

    async def go(db: common.Database) -> tuple[float, float]:
        engine = subject.new_engine(db, steps)
        try:
            warm = await engine.start_run(
                subject.USER, common.question(steps), limits=subject.limits(common.WARMUP_STEPS)
            )
            await engine.run_until_stop(warm.id)
            cpu, wall = _cpu_s(), time.perf_counter()
            run = await engine.start_run(
                subject.USER, common.question(steps), limits=subject.limits(steps + 10)
            )
            outcome = await engine.run_until_stop(run.id)
            wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
            if outcome.kind.value != "answered":
                raise RuntimeError(f"the run stopped {outcome.kind.value}")
            return wall, cpu
        finally:
            await engine.aclose()

    db = common.create_database(backend)
    try:
        wall, cpu = asyncio.run(go(db))
    finally:
        common.drop_database(db)
    print(f"{wall / steps * 1e3:.4f} {cpu / steps * 1e3:.4f}")


def _measure(tree: Path, backend: str, steps: int) -> tuple[float, float]:
    command = [sys.executable, __file__, "--child", str(tree), "--backends", backend]
    done = subprocess.run(
        [*command, "--steps", str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree} on {backend} failed:\n{done.stderr[-3000:]}")
    wall, cpu = done.stdout.split()[-2:]
    return float(wall), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", help="the other tree's root (a checkout of tether)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _one(args.other, args.backends, args.steps)
        return
    trees = {"this": HERE.parent, "other": Path(args.other).resolve()}
    if not (trees["other"] / "benchmarks" / "compare_tether.py").is_file():
        raise SystemExit(
            f"{args.other}: not a checkout of tether (no benchmarks/compare_tether.py)"
        )
    print(f"{args.steps} steps; this tree {trees['this']}, the other {trees['other']}")
    print("backend     tree    round  wall ms/step  CPU ms/step (medians of the round)")
    for backend in args.backends.split(","):
        every: dict[str, list[tuple[float, float]]] = {"this": [], "other": []}
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees.items():
                got = [_measure(tree, backend, args.steps) for _ in range(args.runs)]
                every[name] += got
                wall = statistics.median(g[0] for g in got)
                cpu = statistics.median(g[1] for g in got)
                print(f"{backend:<11} {name:<7} {round_:>5}  {wall:>12.3f}  {cpu:>11.3f}")
        medians = {
            name: (statistics.median(g[0] for g in got), statistics.median(g[1] for g in got))
            for name, got in every.items()
        }
        (tw, tc), (ow, oc) = medians["this"], medians["other"]
        print(
            f"{backend:<11} all     wall {tw:.3f} / {ow:.3f} = {tw / ow:.2f} x,"
            f"  CPU {tc:.3f} / {oc:.3f} = {tc / oc:.2f} x"
        )


if __name__ == "__main__":
    main()
