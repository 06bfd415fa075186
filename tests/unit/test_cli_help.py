"""The command line's help, as a newcomer reads it: plain text (no markup written for
Sphinx), one name and one description for acting as a user, and an ``--agent`` option only
where a command uses an agent."""

from __future__ import annotations

import warnings

import click
import pytest
from click.testing import CliRunner


def command_tree() -> click.Group:
    """The command tree; importing Typer reads names the installed Click deprecates (the
    suite turns warnings into errors), so that deprecation is ignored here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"'click\.[\w.]+' is deprecated", DeprecationWarning)
        import typer.main

        from tether.cli.app import app

        group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    return group


def commands() -> dict[str, click.Command]:
    """Every command by its path (``runs list``), groups included."""
    found: dict[str, click.Command] = {}
    for name, command in command_tree().commands.items():
        found[name] = command
        if isinstance(command, click.Group):
            for sub, leaf in command.commands.items():
                found[f"{name} {sub}"] = leaf
    return found


def options(command: click.Command) -> dict[str, click.Option]:
    return {o: p for p in command.params if isinstance(p, click.Option) for o in p.opts}


def help_of(path: str) -> str:
    shown = CliRunner().invoke(command_tree(), [*path.split(), "--help"], terminal_width=100)
    assert shown.exit_code == 0, shown.output
    return shown.output


@pytest.mark.parametrize("path", ["", *commands()])
def test_every_help_page_is_plain_text(path: str) -> None:
    shown = help_of(path)
    assert "``" not in shown
    assert "reference §" not in shown  # a section of a file the reader does not have open


def test_acting_as_a_user_is_one_option_described_one_way() -> None:
    acting = {path: options(c)["--as"] for path, c in commands().items() if "--as" in options(c)}
    assert set(acting) >= {"approve", "continue", "cancel", "ask", "runs list", "runs migrate"}
    for path, option in acting.items():
        assert option.metavar == "USER", path
        assert (option.help or "").startswith("act as this user ("), path
    # The old spellings still work, out of the help.
    for path, old in (("runs list", "--user"), ("runs migrate", "--by")):
        assert options(commands()[path])[old].hidden
        assert old not in help_of(path)


def test_only_commands_that_use_an_agent_take_one() -> None:
    for path, command in commands().items():
        if path.startswith("users "):  # taken and ignored, out of the help
            assert options(command)["--agent"].hidden, path
            assert "--agent" not in help_of(path), path
    assert "reconcil" in help_of("reap") and "--agent" in help_of("reap")
