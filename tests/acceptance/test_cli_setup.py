"""What people meet setting tether up: a wrong database URL, a missing SQLite file, an
agent in the working folder, and error text printed as it is, through the real CLI."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import inprocess
import processes
import pytest
from demo_procs import free_port as closed_port
from waiting import poll_until

from tether.notify import MemoryNotifier
from tether.store import SchemaStatus, Store, schema_status

# The installed console script, not ``python -m tether``: only the script lacks the
# working folder on its path.
TETHER = str(Path(sys.executable).parent / "tether")


def _missing_pg_database() -> str:
    from conftest import PG_ADMIN_URL

    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/tether_missing_{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("command", [("runs", "list"), ("serve", "--port", "0")])
def test_a_postgresql_database_that_does_not_exist_is_refused_at_once_not_retried(
    command: tuple[str, ...],
) -> None:
    url = _missing_pg_database()
    name = url.rpartition("/")[2]
    done = processes.tether(*command, env=processes.tether_env(url), timeout=120)
    assert done.returncode == 1
    assert "database_misconfigured" in done.stderr
    assert f'database "{name}" does not exist' in done.stderr
    assert f"createdb {name}" in done.stderr
    assert "retrying" not in done.stderr and "database_unavailable" not in done.stderr


def test_a_database_url_that_cannot_be_parsed_is_invalid_config() -> None:
    url = "postgresql://tether:secret@127.0.0.1:notaport/tether"
    done = processes.tether("runs", "list", env=processes.tether_env(url))
    assert done.returncode == 1, done.stderr
    assert "invalid_config" in done.stderr and "cannot be parsed" in done.stderr
    assert "secret" not in done.stderr and "Traceback" not in done.stderr


def test_reading_commands_never_create_a_sqlite_file_and_migrate_never_a_folder(
    tmp_path: Path,
) -> None:
    path = tmp_path / "not" / "here" / "tether.db"
    env = processes.tether_env(f"sqlite:///{path}")
    for command in (("runs", "list"), ("runs", "show", "abc")):
        done = processes.tether(*command, env=env)
        assert done.returncode == 1
        assert "schema_not_ready" in done.stderr
        assert str(path) in done.stderr and "tether migrate" in done.stderr
    assert not (tmp_path / "not").exists()

    # Nor does migrate create a folder: a mistyped path is an error naming the folder.
    refused = processes.tether("migrate", env=env)
    assert refused.returncode == 1
    assert "invalid_config" in refused.stderr and str(path.parent) in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "not").exists()
    path.parent.mkdir(parents=True)
    migrated = processes.tether("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    store = Store(f"sqlite:///{path}")
    assert schema_status(store.engine) is SchemaStatus.CURRENT
    store.close()
    listed = processes.tether("runs", "list", env=env)
    assert listed.returncode == 0, listed.stderr


def test_an_agent_module_in_the_working_folder_loads_with_the_tether_script(
    tmp_path: Path,
) -> None:
    (tmp_path / "shop.py").write_text(
        textwrap.dedent(
            """
            from tether import Agent

            def build_agent():
                return Agent(name="shop", system_prompt="You run a shop.")
            """
        )
    )
    env = processes.tether_env(f"sqlite:///{tmp_path / 'tether.db'}")
    del env["PYTHONPATH"]
    done = subprocess.run(
        [TETHER, "migrate", "--agent", "shop:build_agent"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "No module named" not in done.stderr


def test_error_text_is_printed_as_it_is_not_read_as_markup(tmp_path: Path) -> None:
    env = processes.tether_env(f"sqlite:///{tmp_path / 'tether.db'}", TETHER_PRICES="{bad")
    done = processes.tether("runs", "list", env=env)
    assert done.returncode == 1
    assert "[usd_per_mtok_in, usd_per_mtok_out]" in done.stderr
    assert "'{bad'" in done.stderr


def test_runs_list_prints_whole_ids_that_runs_show_finds(sqlite_url: str) -> None:
    engine = inprocess.engine(sqlite_url, script_name="standard")
    halted = engine.sync.ask("dana", "go", limits={"max_steps": 1})
    engine.close()
    env = processes.tether_env(sqlite_url, COLUMNS="80")

    listed = processes.tether("runs", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert halted.run_id in listed.stdout
    shown = processes.tether("runs", "show", halted.run_id, env=env)
    assert shown.returncode == 0, shown.stderr


def test_ctrl_c_stops_runs_watch_cleanly_with_130(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine(db_url, script_name="send", notifier=notifier)
    waiting = engine.sync.ask("dana", "send").run_id  # suspended: watching never ends
    engine.close()
    watch = subprocess.Popen(
        [processes.PYTHON, "-m", "tether", "runs", "watch", waiting, "--agent", processes.AGENT],
        env=processes.tether_env(db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=processes.ROOT,
    )
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())  # blocks until the first event is out
        assert first["kind"] == "created"
        watch.send_signal(signal.SIGINT)
        _, stderr = watch.communicate(timeout=60)
    finally:
        watch.kill()
        watch.wait()
    assert watch.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr


def test_a_worker_never_creates_a_folder_for_its_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "mistyped" / "tether.db"
    done = processes.tether(
        "worker", "--exit-when-idle", env=processes.tether_env(f"sqlite:///{path}")
    )
    assert done.returncode == 1
    assert "invalid_config" in done.stderr and str(path.parent) in done.stderr
    assert not path.parent.exists()


# The commands a person runs and waits for (reference §6): each fails at once when its
# database cannot be reached, where a worker waits. Arguments that would do nothing harmful
# if the database were there.
INTERACTIVE = (
    ("runs", "list"),
    ("runs", "show", "r1"),
    ("approvals", "list"),
    ("approve", "--run", "r1"),
    ("continue", "r1"),
    ("cancel", "r1"),
    ("ask", "hello", "--as", "dana"),
    ("threads", "list"),
    ("schedules", "list"),
    ("users", "list"),
    ("users", "add", "zed"),
    ("migrate",),
)


@contextmanager
def _silent_server() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel completes them) and never
    says a word: a database host that hangs."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield int(listener.getsockname()[1])


def _assert_one_line_naming(done: subprocess.CompletedProcess[str], where: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error database_unavailable: cannot reach the database at ")
    assert where in lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize("command", INTERACTIVE, ids=" ".join)
def test_an_interactive_command_fails_fast_with_one_line_naming_an_unreachable_database(
    command: tuple[str, ...],
) -> None:
    port = closed_port()
    env = processes.tether_env(f"postgresql://tether@127.0.0.1:{port}/tether")
    # The process's own timeout is the bound (reference §6: within 10 s).
    done = processes.tether(*command, env=env, timeout=10)
    _assert_one_line_naming(done, f"127.0.0.1:{port} (Connection refused)")


@pytest.mark.parametrize("command", [("runs", "list"), ("approve", "--run", "r1"), ("migrate",)])
def test_an_interactive_command_gives_up_on_a_database_that_never_answers(
    command: tuple[str, ...],
) -> None:
    with _silent_server() as port:
        env = processes.tether_env(f"postgresql://tether@127.0.0.1:{port}/tether")
        done = processes.tether(*command, env=env, timeout=10)
    _assert_one_line_naming(done, f"127.0.0.1:{port} (connection timeout expired)")


def test_a_worker_keeps_waiting_for_its_database(tmp_path: Path) -> None:
    env = processes.tether_env(f"postgresql://tether@127.0.0.1:{closed_port()}/tether")
    log = tmp_path / "worker.log"
    worker = processes.spawn("worker", env=env, log=log)
    try:
        poll_until(lambda: log.read_text().count('"db_retry"') >= 3, what="three retries")
        assert worker.poll() is None, log.read_text()
    finally:
        worker.kill()
        worker.wait()


def _agent_module(folder: Path, name: str, source: str) -> dict[str, str]:
    """``folder/name.py`` holding ``source``; the environment to load it from ``folder``."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return processes.tether_env(
        f"sqlite:///{folder / 'tether.db'}", PYTHONPATH=f"{folder}:{processes.ROOT}/tests/support"
    )


def test_an_agent_module_that_fails_to_import_is_one_line_naming_its_file_and_line(
    tmp_path: Path,
) -> None:
    env = _agent_module(
        tmp_path,
        "broken_shop",
        """
        from tether import Agent
        PASSWORD = "hun" + "ter2"

        def build_agent(:
            return Agent(name="shop", system_prompt="You run a shop.")
        """,
    )
    done = processes.tether("runs", "list", env=env, agent="broken_shop:build_agent")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error invalid_config: cannot load agent 'broken_shop:build_agent': invalid syntax "
        f"({tmp_path / 'broken_shop.py'}, line 5)"
    ]


def test_an_unexpected_error_shows_no_variables_of_its_frames(tmp_path: Path) -> None:
    env = _agent_module(
        tmp_path,
        "leaky_shop",
        """
        from contextlib import asynccontextmanager
        from tether import Agent

        @asynccontextmanager
        async def lifespan(agent):
            password = "hun" + "ter2"
            raise RuntimeError("the shop's vault is closed" + password[:0])
            yield agent

        def build_agent():
            return Agent(name="shop", system_prompt="You run a shop.", lifespan=lifespan)
        """,
    )
    assert processes.tether("migrate", env=env, agent="leaky_shop:build_agent").returncode == 0
    done = processes.tether("ask", "hi", "--as", "dana", env=env, agent="leaky_shop:build_agent")
    assert done.returncode == 1
    assert "the shop's vault is closed" in done.stderr  # the error, with its traceback
    assert "hunter2" not in done.stderr + done.stdout  # but no frame's variables


def test_piped_tables_keep_whole_ids_and_questions(sqlite_url: str) -> None:
    question = "Which of our accounts in the north-east region " + "and " * 30 + "why?"
    engine = inprocess.engine(sqlite_url, script_name="standard")
    halted = engine.sync.ask("dana", question, limits={"max_steps": 1})
    engine.close()
    env = processes.tether_env(sqlite_url, COLUMNS="80")  # piped: no terminal to fit

    threads = processes.tether("threads", "list", env=env)
    assert threads.returncode == 0, threads.stderr
    assert question in threads.stdout
    runs = processes.tether("runs", "list", "--as", "dana", env=env)
    assert runs.returncode == 0, runs.stderr
    (row,) = [line for line in runs.stdout.splitlines() if halted.run_id in line]
    assert "max_steps" in row  # one row per run: nothing wrapped onto a second line
    # The old spelling of --as still works.
    old = processes.tether("runs", "list", "--user", "dana", "--json", env=env)
    assert old.returncode == 0 and halted.run_id in old.stdout
