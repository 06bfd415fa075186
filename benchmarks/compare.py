"""tether side by side with its peers (DBOS Transact, LangGraph) on one agent workload.

The workload: a scripted model asks for one read-only tool call per step for N-1 steps,
then answers (N steps). Each tool result carries a distinct, incompressible 8 KiB payload
(``compare_common.payload``). Every system stores the whole history its own way:

* ``floor`` (``compare_floor.py``): one raw-driver transaction per step that INSERTs the
  step's messages and UPDATEs a counters row; the 1x of each backend;
* ``tether`` (``compare_tether.py``): an ``Engine`` with a ``ScriptedModel`` and a read
  tool, ``start_run`` + ``run_until_stop``;
* ``dbos`` (``compare_dbos.py``): a DBOS workflow whose model call and tool call are
  ``@DBOS.step`` functions, their outputs recorded in DBOS's system database;
* ``langgraph`` / ``langgraph-delta`` (``compare_langgraph.py``): a ``StateGraph`` (model
  node, tool node) with a ``messages`` channel, checkpointed every super-step with
  ``durability="sync"`` by ``SqliteSaver`` / ``PostgresSaver``; the first variant uses the
  default reducer channel (``add_messages``), the second LangGraph 1.2's ``DeltaChannel``.

Durability everywhere: SQLite in WAL mode with ``synchronous=FULL``; PostgreSQL with
``synchronous_commit=on``. Each repetition gets a fresh database (a temp SQLite file, or a
PostgreSQL database created and dropped), runs a 3-step warm-up run, then the timed run.

Each system runs in its own subprocess (``compare.py --child SYSTEM ...``, JSON on
stdout), so the peers' imports, threads and global state never share a process with
tether. Rounds interleave the systems: round r runs repetition r of every system, so load
that drifts over time weighs on all of them.

Measured per system and backend, as medians over the repetitions:

* ms/step: the timed run's wall time (its start and its answer included) / N, at every N
  of ``--steps``; the table shows the largest N, the chart all of them;
* stored bytes per step: what the timed run added to the database (SQLite: ``dbstat``
  pages of every b-tree; PostgreSQL: ``pg_total_relation_size`` of every table outside
  the catalogs, TOAST and indexes included) / N;
* both against that backend's floor;
* the stored-check: after every run, the stored steps (messages, step outputs or
  checkpoints) are counted in the database and compared with N, and the last tool result
  is looked for whole; any miss prints FAIL for the row;
* resume latency: a stored run of ``--resume-steps`` (200) tool steps is loaded in a fresh
  process, which takes its next step; timed from opening the system on that database to
  the step stored, as ms and as a ratio to one ordinary step (ms/step of the largest N).
  Each resumption gets its own copy of the stored database. What "resume" means for each
  system is in its module's docstring and in benchmarks/README.md.

Output: the table on stdout and in ``compare.md``, a chart of ms/step against N (one line
per system, one panel per backend) in ``compare.png`` (``--out``; the ``.md`` goes next to
it). Run from the repository root, with the ``compare`` extra installed::

    .venv/bin/pip install -e '.[dev,compare]'
    .venv/bin/python benchmarks/compare.py [--steps 10,50,100,200] [--repeat 5]
        [--systems floor,tether,dbos,langgraph,langgraph-delta] [--backends sqlite,postgresql]
        [--resume-steps 200] [--resume-repeat 3] [--out benchmarks/compare.png] [--quick]
        [--update-readme]

``--quick`` (N=5,20, one repetition, a 20-step run to resume) checks that it works and
writes its chart to the temp folder unless ``--out`` is given. ``--update-readme`` also
puts the figures between the markers of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare_common import (  # noqa: E402
    RESULT_MARK,
    Database,
    Resumed,
    Sample,
    clone_database,
    create_database,
    drop_database,
    emit,
    fresh_database,
    load_average,
)

# system → the module that drives it
SYSTEMS: dict[str, str] = {
    "floor": "compare_floor",
    "tether": "compare_tether",
    "dbos": "compare_dbos",
    "langgraph": "compare_langgraph",
    "langgraph-delta": "compare_langgraph",
}
LABELS = {
    "floor": "floor (1 txn/step)",
    "tether": "tether",
    "dbos": "DBOS Transact",
    "langgraph": "LangGraph",
    "langgraph-delta": "LangGraph, DeltaChannel",
}
COLORS = {
    "floor": "tab:gray",
    "tether": "tab:blue",
    "dbos": "tab:green",
    "langgraph": "tab:red",
    "langgraph-delta": "tab:purple",
}
# system → the package it needs beyond tether's own (the `compare` extra)
NEEDS = {"dbos": "dbos", "langgraph": "langgraph", "langgraph-delta": "langgraph"}
BACKENDS = ("sqlite", "postgresql")
README = HERE / "README.md"
# benchmarks/README.md's figures of the last full run lie between these lines.
BEGIN_FIGURES = "<!-- compare.py figures: begin -->"
END_FIGURES = "<!-- compare.py figures: end -->"
DEFAULT_STEPS = (10, 50, 100, 200)
QUICK_STEPS = (5, 20)
CHILD_TIMEOUT_S = 1800


# -- the child ---------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Run one system's part in this process and ``emit`` its result."""
    module: Any = importlib.import_module(SYSTEMS[args.child])
    if args.mode == "measure":
        samples = []
        for steps in args.steps:
            try:
                with fresh_database(args.backend) as db:
                    sample: Sample = module.measure(args.child, db, steps)
            except Exception as exc:
                traceback.print_exc()
                sample = _failed_sample(args.child, args.backend, steps, f"FAIL: {exc!r}")
            samples.append(sample.to_json())
        emit({"samples": samples, "load": load_average()})
    elif args.mode == "prepare":
        db = Database.from_json(json.loads(args.database))
        key: str = module.prepare(args.child, db, args.resume_steps)
        emit({"key": key})
    else:
        db = Database.from_json(json.loads(args.database))
        resumed: Resumed = module.resume(args.child, db, args.key, args.resume_steps)
        emit(resumed.to_json())


def _failed_sample(system: str, backend: str, steps: int, why: str) -> Sample:
    return Sample(
        system=system, backend=backend, steps=steps, seconds=math.nan, stored_bytes=0, check=why
    )


# -- the parent --------------------------------------------------------------------------


def spawn(system: str, backend: str, mode: str, *extra: str) -> tuple[dict[str, Any] | None, str]:
    """Run a child; its result (None if it gave none) and, on failure, why."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        system,
        "--backends",
        backend,
        "--mode",
        mode,
        *extra,
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"FAIL: timed out after {CHILD_TIMEOUT_S} s"
    results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not results:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return None, f"FAIL: child exited {done.returncode}: {tail}"
    if done.stderr.strip() and "Traceback" in done.stderr:
        sys.stderr.write(done.stderr)
    result: dict[str, Any] = json.loads(results[-1][len(RESULT_MARK) :])
    return result, ""


@dataclass(frozen=True, kw_only=True)
class Figures:
    """Everything measured, for the report and the chart."""

    samples: list[Sample]
    resumes: list[Resumed]
    loads: list[float]


def measure_round(
    systems: Sequence[str], backends: Sequence[str], steps: Sequence[int]
) -> tuple[list[Sample], list[float]]:
    samples: list[Sample] = []
    loads: list[float] = []
    for backend in backends:
        for system in systems:
            started = time.perf_counter()
            result, why = spawn(
                system, backend, "measure", "--steps", ",".join(str(n) for n in steps)
            )
            if result is None:
                got = [_failed_sample(system, backend, n, why) for n in steps]
            else:
                got = [Sample.from_json(s) for s in result["samples"]]
                loads.append(float(result["load"]))
            samples += got
            print(
                f"  {system:<16} {backend:<10} "
                + ", ".join(f"N={s.steps}: {_ms_per_step(s):.2f} ms/step" for s in got)
                + f"  ({time.perf_counter() - started:.0f} s)"
                + "".join(f"  [{s.check}]" for s in got if s.check != "ok"),
                flush=True,
            )
    return samples, loads


def measure_resumes(
    systems: Sequence[str], backends: Sequence[str], steps: int, repeat: int
) -> list[Resumed]:
    """For each system: one stored run of ``steps`` steps, resumed ``repeat`` times, each
    time in a fresh process on a fresh copy of the stored database."""
    resumes: list[Resumed] = []
    folder = tempfile.mkdtemp(prefix="tether-compare-resume-")
    try:
        for backend in backends:
            for system in systems:
                got = _resumes_of(system, backend, steps, repeat, folder)
                resumes += got
                print(
                    f"  {system:<16} {backend:<10} resume: "
                    + ", ".join(f"{r.seconds * 1000:.1f} ms{_waited(r)}" for r in got)
                    + "".join(f"  [{r.check}]" for r in got if r.check != "ok"),
                    flush=True,
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return resumes


def _resumes_of(system: str, backend: str, steps: int, repeat: int, folder: str) -> list[Resumed]:
    def failed(why: str) -> list[Resumed]:
        return [Resumed(system=system, backend=backend, seconds=math.nan, check=why)]

    stored = create_database(backend, folder)
    try:
        common = ["--resume-steps", str(steps)]
        prepared, why = spawn(
            system, backend, "prepare", "--database", json.dumps(stored.to_json()), *common
        )
        if prepared is None:
            return failed(why)
        got: list[Resumed] = []
        for _ in range(repeat):
            copy = clone_database(stored)
            try:
                result, why = spawn(
                    system,
                    backend,
                    "resume",
                    "--database",
                    json.dumps(copy.to_json()),
                    "--key",
                    str(prepared["key"]),
                    *common,
                )
            finally:
                drop_database(copy)
            got += failed(why) if result is None else [Resumed.from_json(result)]
        return got
    finally:
        drop_database(stored)


# -- the report --------------------------------------------------------------------------


def _waited(r: Resumed) -> str:
    return "" if math.isnan(r.waited) else f" (waited {r.waited * 1000:.0f})"


def _ms_per_step(s: Sample) -> float:
    return s.seconds * 1000 / s.steps


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def _cell(value: float, spec: str, suffix: str = "") -> str:
    return "—" if math.isnan(value) else f"{value:{spec}}{suffix}"


@dataclass(frozen=True, kw_only=True)
class Row:
    system: str
    backend: str
    ms: float
    ms_x: float
    stored: float
    stored_x: float
    resume_ms: float
    resume_x: float
    check: str


def rows(figures: Figures, systems: Sequence[str], backends: Sequence[str]) -> list[Row]:
    """The table: each system at the largest N, against its backend's floor."""
    top = max(s.steps for s in figures.samples)
    out: list[Row] = []
    for backend in backends:
        at_top = [s for s in figures.samples if s.backend == backend and s.steps == top]

        def ms_of(system: str, samples: list[Sample] = at_top) -> float:
            return _median([_ms_per_step(s) for s in samples if s.system == system])

        def stored_of(system: str, samples: list[Sample] = at_top) -> float:
            return _median(
                [
                    s.stored_bytes / s.steps
                    for s in samples
                    if s.system == system and not math.isnan(s.seconds)
                ]
            )

        floor_ms, floor_stored = ms_of("floor"), stored_of("floor")
        for system in systems:
            ms, stored = ms_of(system), stored_of(system)
            resume = _median(
                [
                    r.seconds * 1000
                    for r in figures.resumes
                    if r.system == system and r.backend == backend
                ]
            )
            checks = [
                s.check for s in figures.samples if s.system == system and s.backend == backend
            ] + [r.check for r in figures.resumes if r.system == system and r.backend == backend]
            bad = [c for c in checks if c != "ok"]
            out.append(
                Row(
                    system=system,
                    backend=backend,
                    ms=ms,
                    ms_x=ms / floor_ms if floor_ms else math.nan,
                    stored=stored,
                    stored_x=stored / floor_stored if floor_stored else math.nan,
                    resume_ms=resume,
                    resume_x=resume / ms if ms else math.nan,
                    check=f"ok ({len(checks)})"
                    if not bad
                    else f"FAIL ({len(bad)}/{len(checks)}): {bad[0]}"[:160],
                )
            )
    return out


TIMES = "\N{MULTIPLICATION SIGN}"
HEADER = (
    "system",
    "backend",
    "ms/step",
    f"{TIMES} floor",
    "stored B/step",
    f"{TIMES} floor",
    "resume ms",
    "resume \N{DIVISION SIGN} step",
    "stored-check",
)


def _cells(r: Row) -> list[str]:
    return [
        LABELS[r.system],
        r.backend,
        _cell(r.ms, ".2f"),
        _cell(r.ms_x, ".1f", TIMES),
        _cell(r.stored, ",.0f"),
        _cell(r.stored_x, ".2f", TIMES),
        _cell(r.resume_ms, ".1f"),
        _cell(r.resume_x, ".1f", TIMES),
        r.check,
    ]


def text_table(table: list[Row]) -> str:
    lines = [list(HEADER), *(_cells(r) for r in table)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    right = {2, 3, 4, 5, 6, 7}
    return "\n".join(
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ).rstrip()
        for line in lines
    )


def markdown_table(table: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in table]
    return "\n".join(lines)


def notes(figures: Figures, systems: Sequence[str], backends: Sequence[str]) -> list[str]:
    """Where a resumption's time went, for the systems that show it."""
    out: list[str] = []
    for backend in backends:
        for system in systems:
            got = [r for r in figures.resumes if r.system == system and r.backend == backend]
            waited = _median([r.waited * 1000 for r in got])
            if not math.isnan(waited):
                total = _median([r.seconds * 1000 for r in got])
                out.append(
                    f"{LABELS[system]}, {backend}: of the {total:.0f} ms resume, {waited:.0f} ms"
                    " passed before the process began to execute the recovered workflow"
                    " (recovery re-enqueues it; DBOS's internal queue is polled about once a"
                    f" second), {total - waited:.0f} ms replaying its recorded steps and"
                    " taking the next"
                )
    return out


def by_n(figures: Figures, systems: Sequence[str], backends: Sequence[str]) -> str:
    """Median ms/step at every N (the chart's figures), as a markdown table."""
    ns = sorted({s.steps for s in figures.samples})
    lines = [
        "| system | backend | " + " | ".join(f"N={n}" for n in ns) + " |",
        "|---|---|" + "---|" * len(ns),
    ]
    for backend in backends:
        for system in systems:
            cells = [
                _cell(
                    _median(
                        [
                            _ms_per_step(s)
                            for s in figures.samples
                            if s.system == system and s.backend == backend and s.steps == n
                        ]
                    ),
                    ".2f",
                )
                for n in ns
            ]
            lines.append(f"| {LABELS[system]} | {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(
    figures: Figures, systems: Sequence[str], backends: Sequence[str], repeats: int, out: Path
) -> None:
    """ms/step against N: one panel per backend, one line per system (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    ns = sorted({s.steps for s in figures.samples})
    fig, axes = plt.subplots(1, len(backends), figsize=(6 * len(backends), 4.5), squeeze=False)
    for ax, backend in zip(axes[0], backends, strict=True):
        for system in systems:
            ys = [
                _median(
                    [
                        _ms_per_step(s)
                        for s in figures.samples
                        if s.system == system and s.backend == backend and s.steps == n
                    ]
                )
                for n in ns
            ]
            ax.plot(ns, ys, marker="o", label=LABELS[system], color=COLORS[system])
        ax.set_title(backend)
        ax.set_xlabel("steps in the run (N)")
        ax.set_ylabel("ms per step (median; log scale)")
        ax.set_yscale("log")
        ax.set_xticks(ns)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(_minor_label))
        ax.grid(True, which="both", alpha=0.3)
    # One legend under both panels, where no line runs.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small")
    fig.suptitle(f"8 KiB tool result per step, durable commits; median of {repeats} repetition(s)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _minor_label(value: float, _pos: int) -> str:
    """Label the 2s and 5s between the decades of a log axis, and nothing else."""
    text = f"{value:g}"
    return text if text.lstrip("0.")[:1] in ("2", "5") else ""


# -- the command -------------------------------------------------------------------------


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="tether beside DBOS and LangGraph.")
    parser.add_argument("--steps", type=_csv(int), default=None, help="N list, e.g. 10,50,200")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    parser.add_argument("--systems", type=_csv(str), default=list(SYSTEMS))
    parser.add_argument("--backends", type=_csv(str), default=list(BACKENDS))
    parser.add_argument("--resume-steps", type=int, default=None, help="default 200")
    parser.add_argument("--resume-repeat", type=int, default=None, help="default 3")
    parser.add_argument("--out", type=Path, default=None, help="the PNG (default: here)")
    parser.add_argument("--quick", action="store_true", help="N=5,20, 1 repetition")
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="also put the figures into benchmarks/README.md (between its markers)",
    )
    parser.add_argument("--child", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["measure", "prepare", "resume"], help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [s for s in args.systems if s not in SYSTEMS] + [
        b for b in args.backends if b not in BACKENDS
    ]
    if unknown:
        parser.error(f"unknown systems or backends: {', '.join(unknown)}")
    missing = sorted(
        {
            NEEDS[s]
            for s in args.systems
            if s in NEEDS and importlib.util.find_spec(NEEDS[s]) is None
        }
        | ({"matplotlib"} if importlib.util.find_spec("matplotlib") is None else set())
    )
    if missing and not args.child:
        parser.error(
            f"missing {', '.join(missing)}: install the extra (pip install -e '.[dev,compare]')"
            " or leave those systems out (--systems)"
        )
    quick = args.quick
    args.steps = args.steps or list(QUICK_STEPS if quick else DEFAULT_STEPS)
    args.repeat = args.repeat or (1 if quick else 5)
    args.resume_steps = args.resume_steps or (20 if quick else 200)
    args.resume_repeat = args.resume_repeat or (1 if quick else 3)
    if args.out is None:
        args.out = (
            Path(tempfile.gettempdir(), "compare-quick.png") if quick else HERE / "compare.png"
        )
    if min(args.steps) < 2 or args.repeat < 1 or args.resume_steps < 2:
        parser.error("every N must be at least 2, and --repeat at least 1")
    args.backend = args.backends[0]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    command = ".venv/bin/python benchmarks/compare.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    started = time.perf_counter()
    load_start = load_average()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{command}: N={args.steps}, {args.repeat} repetition(s); load average {load_start:.2f}")
    samples: list[Sample] = []
    loads: list[float] = []
    for r in range(args.repeat):
        print(f"round {r + 1}/{args.repeat}", flush=True)
        got, got_loads = measure_round(args.systems, args.backends, args.steps)
        samples += got
        loads += got_loads
    print(f"resumption of a stored {args.resume_steps}-step run, in a fresh process", flush=True)
    resumes = measure_resumes(args.systems, args.backends, args.resume_steps, args.resume_repeat)
    figures = Figures(samples=samples, resumes=resumes, loads=loads)
    table = rows(figures, args.systems, args.backends)
    elapsed = time.perf_counter() - started
    load_end = load_average()
    top = max(args.steps)
    summary = (
        f"{when}: N={top} steps (8 KiB tool result each), medians of {args.repeat}"
        f" repetition(s); resume: {args.resume_steps}-step run, median of"
        f" {args.resume_repeat}; load average {load_start:.2f} at start, {load_end:.2f} at end"
        f" (children: {min(loads, default=math.nan):.2f}-{max(loads, default=math.nan):.2f});"
        f" {elapsed:.0f} s in all, {os.cpu_count()} cores"
    )
    print()
    print(summary)
    print(text_table(table))
    remarks = notes(figures, args.systems, args.backends)
    for line in remarks:
        print(f"note: {line}")
    chart(figures, args.systems, args.backends, args.repeat, args.out)
    block = "\n\n".join(
        [
            f"`{command}`",
            summary,
            markdown_table(table),
            *(f"Note: {line}." for line in remarks),
            "ms/step at every N (the chart):",
            by_n(figures, args.systems, args.backends),
        ]
    )
    md = args.out.with_suffix(".md")
    md.write_text(f"# compare.py, last run\n\n{block}\n")
    print(f"\nchart: {args.out}\ntable: {md}")
    if args.update_readme:
        update_readme(block)
        print(f"figures: {README}")


def update_readme(block: str) -> None:
    """Replace the figures between the markers of benchmarks/README.md with ``block``."""
    text = README.read_text()
    start, end = text.find(BEGIN_FIGURES), text.find(END_FIGURES)
    if start < 0 or end < start:
        raise SystemExit(f"{README}: the figure markers are missing")
    README.write_text(text[: start + len(BEGIN_FIGURES)] + "\n" + block + "\n" + text[end:])


if __name__ == "__main__":
    main()
