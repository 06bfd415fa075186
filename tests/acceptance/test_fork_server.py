"""The fork server the tests start their ``tether`` processes with (tests/support/
forkserver.py, forked.py). A process it forks is what ``python -m tether`` would be, held
against a fresh interpreter's: exactly its environment, its directory, ``sys.path``,
``sys.argv``, ``__main__``, descriptors and signal handlers, its output where asked, the
same output and exit code for the same command; it ends as ``Popen`` says (137 for a crash
failpoint, -9 for SIGKILL); it is a process of its own, the server's child, never this
process's (whose threads and their locks it so never inherits). What a fork cannot give
(an environment the server's imports read differently, a module of a name the server
imported on the path) is started fresh."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import forked
import forkserver
import inprocess
import processes
from waiting import poll_until, run_sync

from tether import Engine

SUPPORT = processes.ROOT / "tests" / "support"
# An agent module whose factory writes down what the process it is loaded in looks like.
PROBE = """
import json, os, signal, sys
from tether import Agent, ScriptedModel

def _handler(handler):
    if isinstance(handler, signal.Handlers):
        return handler.name
    return getattr(getattr(handler, "func", handler), "__qualname__", repr(handler))

def agent():
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    main = sys.modules["__main__"]
    facts = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": sys.path,
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "main": [main.__file__, main.__spec__.name],
        "dont_write_bytecode": sys.dont_write_bytecode,
        "fds": sorted(os.listdir("/proc/self/fd")),
        "signals": {
            name: _handler(signal.getsignal(getattr(signal, name)))
            for name in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIGHUP", "SIGXFSZ")
        },
        "wakeup": wakeup,
    }
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump(facts, out)
    return Agent(name="probe", system_prompt="p", default_model=lambda: ScriptedModel([]))
"""


def _probe(env: dict[str, str], out: Path, cwd: Path, *, fresh: bool) -> dict[str, Any]:
    """What ``tether worker --exit-when-idle --agent probe:agent`` looked like inside."""
    done = processes.tether(
        "worker",
        "--exit-when-idle",
        env={**env, "PROBE_OUT": str(out)},
        agent="probe:agent",
        cwd=cwd,
        fresh=fresh,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts: dict[str, Any] = json.loads(out.read_text())
    return facts


def _probe_env(sqlite_url: str, folder: Path, **extra: str) -> dict[str, str]:
    (folder / "probe.py").write_text(PROBE)
    return processes.tether_env(sqlite_url, PYTHONPATH=f"{folder}:{SUPPORT}", **extra)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_a_forked_process_is_what_a_fresh_interpreter_would_be(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = _probe_env(sqlite_url, tmp_path, PYTHONDONTWRITEBYTECODE="")
    # A variable of the server's own environment that this process's lacks.
    server = forked.server()
    dropped = sorted(
        name
        for name in forked.BASELINE
        if name not in server.read and not forkserver.at_startup(name) and name in env
    )[0]
    del env[dropped]
    fresh = _probe(env, tmp_path / "fresh.json", tmp_path, fresh=True)
    fork = _probe(env, tmp_path / "forked.json", tmp_path, fresh=False)
    assert dropped not in fork["env"]
    assert fresh["ppid"] == os.getpid()  # held against a child of this process
    assert fork["ppid"] == server.proc.pid != os.getpid()  # the server's: nothing of ours
    assert fork["pid"] not in (os.getpid(), server.proc.pid, fresh["pid"])
    assert fork["env"] == {**env, "PROBE_OUT": str(tmp_path / "forked.json")}  # exactly
    assert fresh["env"] == {**env, "PROBE_OUT": str(tmp_path / "fresh.json")}
    for fact in ("cwd", "path", "argv", "orig_argv", "main", "dont_write_bytecode"):
        assert fork[fact] == fresh[fact], fact
    assert fork["cwd"] == str(tmp_path) and fork["path"][:3] == [str(tmp_path)] * 2 + [str(SUPPORT)]
    assert fork["fds"] == fresh["fds"]  # none of the server's left open
    # The worker's loop (uvloop) sets a wakeup fd of its own as it starts: the same in both.
    assert fork["signals"] == fresh["signals"] and fork["wakeup"] == fresh["wakeup"]
    assert fork["signals"]["SIGCHLD"] == "SIG_DFL"


def test_bytecode_writing_follows_each_processs_environment(
    sqlite_url: str, tmp_path: Path
) -> None:
    env = _probe_env(sqlite_url, tmp_path, PYTHONDONTWRITEBYTECODE="1")
    fork = _probe(env, tmp_path / "forked.json", tmp_path, fresh=False)
    assert fork["dont_write_bytecode"] is True and fork["ppid"] != os.getpid()
    assert not (tmp_path / "__pycache__").exists()  # probe.py was imported, not cached


def test_a_forked_command_prints_and_exits_as_a_fresh_one(sqlite_url: str) -> None:
    env = processes.tether_env(sqlite_url)
    started_fresh = sum(forked.fallbacks.values())
    for command in (("runs", "show", "no-such-run"), ("runs", "show"), ("runs", "list", "--json")):
        fork = processes.tether(*command, env=env)
        fresh = processes.tether(*command, env=env, fresh=True)
        assert (fork.returncode, fork.stdout, fork.stderr) == (
            fresh.returncode,
            fresh.stdout,
            fresh.stderr,
        ), command
    usage = processes.tether("runs", "show", env=env)
    assert usage.returncode == 2 and "Usage: python -m tether runs show" in usage.stderr
    assert sum(forked.fallbacks.values()) == started_fresh  # each `fork` was forked


def _registered(engine: Engine, pid: int) -> bool:
    """Whether process ``pid`` is among the live workers (ids ``host:pid:suffix``)."""
    live = run_sync(engine.operator.live_workers())
    return any(worker.rsplit(":", 2)[1] == str(pid) for worker in live)


def test_a_crash_failpoint_is_137_and_sigkill_is_minus_9(sqlite_url: str, tmp_path: Path) -> None:
    engine = inprocess.engine(sqlite_url, script_name="standard")
    engine.sync.start_run("dana", "go")
    env = processes.tether_env(sqlite_url, KIT_SCRIPT="standard")
    crashing = {**env, "TETHER_FAILPOINTS": "before_model_call=crash"}
    crashed = processes.start("worker", "--exit-when-idle", "--no-reap", env=crashing)
    assert isinstance(crashed, forked.Forked)
    _, err = crashed.communicate(timeout=120)
    assert crashed.returncode == 137, err[-3000:]

    log = tmp_path / "worker.log"
    worker = processes.spawn("worker", env=env, log=log)
    assert isinstance(worker, forked.Forked) and worker.pid != os.getpid()
    assert Path(f"/proc/{worker.pid}").exists() and worker.poll() is None
    assert _parent(worker.pid) == forked.server().proc.pid
    try:
        poll_until(lambda: _registered(engine, worker.pid), what="the worker registered")
    finally:
        engine.close()
    worker.kill()
    assert worker.wait(timeout=60) == -signal.SIGKILL
    assert processes.ended(worker.pid)
    worker.kill()  # once it ended: nothing, as Popen's


def test_what_a_fork_cannot_give_is_started_fresh(sqlite_url: str, tmp_path: Path) -> None:
    """``COLUMNS`` sizes the CLI's Rich consoles as it is imported; a module on the path
    named as one the server imported would be what a fresh interpreter imports."""
    columns = "123" if forked.BASELINE.get("COLUMNS") != "123" else "124"  # not the server's
    wide = _probe(
        _probe_env(sqlite_url, tmp_path, COLUMNS=columns),
        tmp_path / "a.json",
        tmp_path,
        fresh=False,
    )
    assert wide["ppid"] == os.getpid()
    piped = processes.start(
        "runs", "list", "--json", env=processes.tether_env(sqlite_url, COLUMNS=columns)
    )
    assert not isinstance(piped, forked.Forked)
    out, err = piped.communicate(timeout=60)
    assert piped.returncode == 0 and json.loads(out)["items"] == [], err
    shadowing = tmp_path / "shadowing"
    shadowing.mkdir()
    (shadowing / "typer.py").write_text("raise SystemExit('typer shadowed')")
    env = _probe_env(sqlite_url, tmp_path)
    env["PYTHONPATH"] = f"{shadowing}:{env['PYTHONPATH']}"
    done = processes.tether("runs", "list", env=env)
    assert done.returncode == 1 and "typer shadowed" in done.stderr  # as `python -m` says
    reasons = dict(forked.fallbacks)
    assert any("COLUMNS" in reason for reason in reasons)
    assert f"{shadowing} holds a module named typer" in reasons
