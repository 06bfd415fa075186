"""How long the everyday ``tether`` commands take, start to exit, as a person runs them.

On a fresh SQLite database in a temporary folder, with the demo agent (its scripted
model; with no ``TETHER_SANDBOX_URL`` it starts its sandbox CRM in-process, its data in
``sandbox.db`` beside the database): ``tether migrate``, then runs of dana's asking for
Henderson's quote carried by ``tether worker --exit-when-idle`` to the send, which waits
for miguel. Then each command below ``--repeat`` times (default 5) after one untimed
warm-up, in the installed ``tether`` script, with ``python -c pass`` as the baseline in
the same run:

- ``tether --help``;
- ``tether runs list``, ``tether approvals list`` (the operator's view);
- ``tether approvals list --as miguel`` (his requests, by each owner's scope, which the
  demo asks its CRM) and ``tether approve --run RUN_ID --as miguel`` (a real approval of
  its own waiting run each time: the re-checks and the send go to the CRM), as in the
  README: beside ``tether serve`` (``--workers 0`` here), whose sandbox they use; and,
  for information, with nothing else running, when each starts a sandbox of its own
  (FastAPI and uvicorn in the process, for one command).

Printed: the median and the fastest wall-clock time of each, the median CPU time (user +
system) of the process, and the median against the target (PASS / MISS; target: 0.6 s for
``runs list``, ``approvals list`` and ``approve``). The bytecode of tether's modules is
written by the warm-up (``PYTHONDONTWRITEBYTECODE`` is left out of the commands'
environment), as an installed package has it; an editable install that may not write it
compiles tether's modules at every start. Figures are printed, never asserted. Run it from
the repository root::

    .venv/bin/python benchmarks/cli_start.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

TETHER = str(Path(sys.executable).parent / "tether")
TARGET_S = 0.6
QUESTION = "Draft and send a quote for Henderson, 200 of SKU-4411"
TARGETED = {"runs list", "approvals list", "approve --run RUN --as miguel"}


def run(args: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Run ``args`` to its end (it must succeed); its wall-clock and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def environment(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TETHER_DATABASE_URL"] = f"sqlite:///{folder / 'tether.db'}"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def suspended_runs(env: dict[str, str], folder: Path, count: int) -> list[str]:
    """``count`` runs of dana's, each waiting for a decision on its send; their ids."""
    run([TETHER, "migrate"], env, folder)
    for _ in range(count):
        run([TETHER, "ask", QUESTION, "--as", "dana"], env, folder)
    run([TETHER, "worker", "--exit-when-idle"], env, folder)
    listed = subprocess.run(
        [TETHER, "approvals", "list", "--json"],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    ids = [item["run_id"] for item in json.loads(listed.stdout)["items"]]
    if len(ids) != count:
        raise SystemExit(f"expected {count} waiting sends, found {len(ids)}")
    return ids


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(env: dict[str, str], folder: Path) -> Iterator[None]:
    """``tether serve --workers 0`` on the database (the README's set-up: its sandbox,
    started in-process, is the one the commands beside it use), until it is ready."""
    port = free_port()
    args = [TETHER, "serve", "--port", str(port), "--workers", "0"]
    proc = subprocess.Popen(
        args, env=env, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("tether serve did not start")
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def measure(
    name: str, commands: Sequence[Sequence[str]], env: dict[str, str], folder: Path
) -> tuple[str, list[float], list[float]]:
    """The first of ``commands`` untimed (a warm-up), then the others timed."""
    walls: list[float] = []
    cpus: list[float] = []
    for i, args in enumerate(commands):
        wall, cpu = run(args, env, folder)
        if i:
            walls.append(wall)
            cpus.append(cpu)
    return name, walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    repeat = options.repeat
    with tempfile.TemporaryDirectory(prefix="tether-cli-start-") as name:
        folder = Path(name)
        env = environment(folder)
        waiting = suspended_runs(env, folder, 2 * (repeat + 1))
        alone, beside = waiting[: repeat + 1], waiting[repeat + 1 :]
        times = repeat + 1

        def same(*args: str) -> list[list[str]]:
            return [list(args)] * times

        def approving(runs: list[str]) -> list[list[str]]:
            return [[TETHER, "approve", "--run", r, "--as", "miguel"] for r in runs]

        rows = [
            measure("python -c pass", same(sys.executable, "-c", "pass"), env, folder),
            measure("--help", same(TETHER, "--help"), env, folder),
            measure("runs list", same(TETHER, "runs", "list"), env, folder),
            measure("approvals list", same(TETHER, "approvals", "list"), env, folder),
            measure(
                "approvals list --as, nothing running",
                same(TETHER, "approvals", "list", "--as", "miguel"),
                env,
                folder,
            ),
            measure("approve, nothing else running", approving(alone), env, folder),
        ]
        with serving(env, folder):
            rows.append(measure("approve --run RUN --as miguel", approving(beside), env, folder))
            rows.append(
                measure(
                    "approvals list --as miguel",
                    same(TETHER, "approvals", "list", "--as", "miguel"),
                    env,
                    folder,
                )
            )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'command':<38} {'median s':>9} {'fastest':>8} {'cpu s':>7}  target")
    for name, walls, cpus in rows:
        median = statistics.median(walls)
        verdict = ""
        if name in TARGETED:
            verdict = f"<= {TARGET_S}  {'PASS' if median <= TARGET_S else 'MISS'}"
        print(
            f"{name:<38} {median:9.3f} {min(walls):8.3f} {statistics.median(cpus):7.3f}  {verdict}"
        )


if __name__ == "__main__":
    main()
