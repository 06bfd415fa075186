"""``tether worker --processes``: the values accepted (an integer from 1 to 256, or ``auto``,
one per core), and a value not accepted refused as a usage error before anything starts
(no process: under ``--no-processes`` starting one would fail the test; no database)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tether.cli.supervisor import MAX_PROCESSES, cores, process_count


def command_tree() -> click.Group:
    """The command tree (importing Typer reads names the installed Click deprecates)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"'click\.[\w.]+' is deprecated", DeprecationWarning)
        import typer.main

        from tether.cli.app import app

        group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    return group


def test_auto_is_one_process_per_core_this_process_may_use() -> None:
    assert cores() == len(os.sched_getaffinity(0))
    assert process_count("auto") == process_count(" AUTO ") == min(cores(), MAX_PROCESSES)


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("2", 2), (" 8 ", 8), ("256", 256)])
def test_an_integer_from_1_to_256_is_that_many_processes(text: str, count: int) -> None:
    assert process_count(text) == count


@pytest.mark.parametrize("value", ["0", "-1", "257", "many", "2.5", ""])
def test_a_processes_value_not_accepted_is_a_usage_error_and_starts_nothing(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "never.db"
    monkeypatch.setenv("TETHER_DATABASE_URL", f"sqlite:///{database}")
    ran = CliRunner().invoke(command_tree(), ["worker", f"--processes={value}"])
    assert ran.exit_code == 2, ran.output
    said = " ".join(ran.output.replace("│", " ").split())
    assert "Invalid value for '--processes'" in said
    assert "an integer from 1 to 256, or auto (one per core)" in said
    assert not database.exists()  # not even the start-up check ran
