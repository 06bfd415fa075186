"""docs/reference.md is the user's contract, and it is kept true by the code: its tables of
error codes, failpoints, settings, states and transitions, commands and metrics are read here
and compared with what tether defines, in both directions, so neither can change alone."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from tether import errors, failpoints
from tether.api.statuses import STATUS, status_for
from tether.config import Settings
from tether.reasons import FailReason, HaltReason
from tether.runs import TERMINAL, TRANSITIONS, RunState


def cli_command() -> click.Group:
    """The `tether` command tree, built from the Typer app. Importing Typer reads names the
    installed Click deprecates, which the suite's warnings-as-errors would turn into a
    failed import: that one deprecation is ignored, here only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"'click\.[\w.]+' is deprecated", DeprecationWarning)
        import typer.main

        from tether.cli.app import app

    command = typer.main.get_command(app)
    assert isinstance(command, click.Group)
    return command


REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
SECTIONS = range(1, 22)  # the contract, sections 1 to 21; docstrings cite them as "reference §N"
_HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)
_CODE = re.compile(r"`([^`]+)`")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
_CITATION = re.compile(r"§\s?(\d+)")


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def reference() -> str:
    return REFERENCE.read_text(encoding="utf-8")


def sections() -> dict[int, str]:
    """The reference's numbered sections (``## N. Title``), each up to the next one."""
    text = reference()
    found = list(_HEADING.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return {int(m.group(1)): text[m.start() : end] for m, end in zip(found, ends, strict=True)}


def section(number: int) -> str:
    found = sections()
    assert number in found, f"docs/reference.md has no section '## {number}. ...'"
    return found[number]


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in _CELL_SPLIT.split(line.strip().strip("|")))


def tables(text: str) -> Iterator[Table]:
    """Every Markdown table in ``text``: its header cells and its rows' cells."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1]):
            header = _cells(lines[i])
            rows: list[tuple[str, ...]] = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            yield Table(header=header, rows=tuple(rows))
        else:
            i += 1


def table(number: int, *header: str) -> Table:
    """The table of section ``number`` whose header is ``header``."""
    for found in tables(section(number)):
        if found.header == header:
            return found
    raise AssertionError(f"reference §{number} has no table headed {' | '.join(header)}")


def codes(cell: str) -> list[str]:
    """The `code` spans of a cell, with Markdown's escaped pipes restored."""
    return [code.replace("\\|", "|") for code in _CODE.findall(cell)]


def first_code(row: tuple[str, ...]) -> str:
    found = codes(row[0])
    assert found, f"a row without a `code` in its first cell: {row}"
    return found[0]


def column(found: Table) -> list[str]:
    """The `code` of each row's first cell, in order."""
    return [first_code(row) for row in found.rows]


def test_the_reference_keeps_the_contracts_section_numbers_and_cites_nothing_outside() -> None:
    text = reference()
    assert list(sections()) == list(SECTIONS)
    assert "SPEC" not in text
    assert "../" not in text and "/work/" not in text


def test_every_section_the_code_and_the_docs_cite_exists() -> None:
    # Docstrings, comments, templates and the docs cite "reference §N" (or "§N" beside
    # it): a renumbered or removed section must take its citations with it.
    root = REFERENCE.parents[1]
    cited = [
        root / "README.md",
        root / "pyproject.toml",
        *(
            path
            for folder in ("src", "tests", "docs", "benchmarks")
            for path in sorted((root / folder).rglob("*"))
            if path.suffix in {".py", ".md", ".html", ".js"}
        ),
    ]
    wrong = [
        f"{path.relative_to(root)}: §{number}"
        for path in cited
        for number in _CITATION.findall(path.read_text(encoding="utf-8"))
        if int(number) not in SECTIONS
    ]
    assert wrong == [], f"citations of sections the reference does not have: {wrong}"


# -- (a) errors -------------------------------------------------------------------------------


def _all_subclasses(cls: type[errors.TetherError]) -> Iterator[type[errors.TetherError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def module_codes() -> set[str]:
    """The codes of the errors ``tether.errors`` defines (its abstract root aside)."""
    return {
        value.code
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, errors.TetherError)
        and value is not errors.TetherError
        and value.__module__ == errors.__name__
    }


def error_rows() -> dict[str, str]:
    """The reference's error table: code → its HTTP status cell."""
    found = table(4, "code", "HTTP status", "meaning")
    listed = column(found)
    assert len(listed) == len(set(listed)), f"a code is listed twice: {listed}"
    return {first_code(row): row[1] for row in found.rows}


def test_every_error_code_of_the_errors_module_and_the_status_map_is_in_the_reference() -> None:
    listed = error_rows()
    assert module_codes() - set(listed) == set()
    assert set(STATUS) - set(listed) == set()


def test_every_error_code_the_reference_lists_exists() -> None:
    # Every loaded TetherError (tether.api.schemas loads the engine, and with it the tools'
    # errors), and the codes only the HTTP layer answers with, which the status map names.
    defined = {sub.code for sub in _all_subclasses(errors.TetherError)}
    known = module_codes() | defined | set(STATUS)
    assert set(error_rows()) - known == set()


def test_each_error_code_has_the_http_status_the_api_answers_with() -> None:
    wrong = {
        code: (cell, status_for(code))
        for code, cell in error_rows().items()
        if cell != str(status_for(code))
    }
    assert wrong == {}


# -- (b) failpoints ---------------------------------------------------------------------------


def test_every_failpoint_is_documented_and_every_documented_one_exists() -> None:
    listed = column(table(7, "failpoint", "the moment", "what the next owner does"))
    assert len(listed) == len(set(listed)), f"a failpoint is listed twice: {listed}"
    assert set(listed) == set(failpoints.POINTS)


def test_every_failpoint_action_is_documented() -> None:
    text = section(7)
    missing = [action for action in failpoints.ACTIONS if f"={action}" not in text]
    assert missing == []


# -- (c) environment --------------------------------------------------------------------------


class RecordingEnv(Mapping[str, str]):
    """An empty environment that remembers every variable asked for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def variables_read() -> set[str]:
    env = RecordingEnv()
    Settings.from_env(env)
    assert "TETHER_DATABASE_URL" in env.asked  # the recording works
    return {name for name in env.asked if name.startswith("TETHER_")}


def environment_rows() -> dict[str, str]:
    """The reference's environment table: variable → its default cell."""
    found = table(5, "variable", "meaning", "default")
    return {first_code(row): row[2] for row in found.rows}


def test_every_variable_settings_reads_is_documented() -> None:
    assert variables_read() - set(environment_rows()) == set()


def test_every_tether_variable_the_reference_lists_is_read_by_settings() -> None:
    listed = {name for name in environment_rows() if name.startswith("TETHER_")}
    assert listed - variables_read() == set()


def test_the_documented_defaults_are_the_settings_defaults() -> None:
    defaults = Settings()
    checked = 0
    wrong: dict[str, tuple[str, object]] = {}
    for name, cell in environment_rows().items():
        field = name.removeprefix("TETHER_").lower()
        value = getattr(defaults, field, None)
        if isinstance(value, bool) or not isinstance(value, int | float | str) or value == "":
            continue  # no default of its own (None, an empty tuple or mapping)
        shown = value if isinstance(value, str) else f"{value:g}"
        if not re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.])", cell):
            wrong[name] = (cell, value)
        checked += 1
    assert checked >= 10
    assert wrong == {}


# -- (d) states and transitions ---------------------------------------------------------------


def test_every_state_is_documented_with_whether_it_is_terminal() -> None:
    found = table(1, "state", "meaning", "terminal")
    documented = {first_code(row): row[2] for row in found.rows}
    assert set(documented) == {state.value for state in RunState}
    expected = {state.value: "yes" if state in TERMINAL else "no" for state in RunState}
    assert documented == expected


def test_the_transition_table_is_the_codes() -> None:
    found = table(1, "from", "to")
    documented = {first_code(row): set(codes(row[1])) for row in found.rows}
    assert len(documented) == len(found.rows), "a state is listed twice"
    expected = {src.value: {dst.value for dst in TRANSITIONS[src]} for src in RunState}
    assert documented == expected


def _reasons(text: str, label: str) -> set[str]:
    match = re.search(rf"\*\*{label}:\*\*(.*?)(?:\*\*|\n\n)", text, re.DOTALL)
    assert match is not None, f"reference §6 has no '**{label}:**' list"
    return set(codes(match.group(1)))


def test_every_halt_and_fail_reason_is_documented() -> None:
    text = section(6)
    assert _reasons(text, "Halt reasons") == {reason.value for reason in HaltReason}
    assert _reasons(text, "Fail reasons") == {reason.value for reason in FailReason}


# -- (e) the command line ---------------------------------------------------------------------


def cli_commands() -> dict[tuple[str, ...], click.Command]:
    """Every command of the CLI by its path: top-level ones and those of each group."""
    found: dict[tuple[str, ...], click.Command] = {}
    for name, command in cli_command().commands.items():
        if isinstance(command, click.Group):
            for sub, leaf in command.commands.items():
                found[(name, sub)] = leaf
        else:
            found[(name,)] = command
    return found


def command_rows() -> dict[tuple[str, ...], tuple[str, str]]:
    """The reference's command table: path → (its usage, its options cell)."""
    found = table(6, "command", "options", "what it does")
    rows: dict[tuple[str, ...], tuple[str, str]] = {}
    for row in found.rows:
        usage = first_code(row)
        words = usage.split()
        assert words[0] == "tether", f"not a tether command: {usage}"
        path = tuple(word for word in words[1:] if re.fullmatch(r"[a-z][a-z-]*", word))
        assert path not in rows, f"{usage} is listed twice"
        rows[path] = (usage, row[1])
    return rows


def test_every_command_and_subcommand_is_documented_and_exists() -> None:
    documented = set(command_rows())
    commands = set(cli_commands())
    assert {path for path in commands if path[0] == "runs"} <= documented
    assert commands == documented


def test_each_commands_arguments_and_options_are_the_documented_ones() -> None:
    rows = command_rows()
    wrong: dict[str, object] = {}
    for path, command in cli_commands().items():
        if path not in rows:
            wrong[" ".join(path)] = "not in the reference's command table"
            continue
        usage, options = rows[path]
        arguments = [
            p.name.upper() for p in command.params if isinstance(p, click.Argument) and p.name
        ]
        declared = [o for p in command.params if isinstance(p, click.Option) for o in p.opts]
        accepted = {
            o
            for p in command.params
            if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)
        }
        listed = set(_OPTION.findall(options))
        problems = {
            "arguments missing from the usage": [a for a in arguments if a not in usage.split()],
            "options not documented": [o for o in declared if o not in listed],
            "documented options that do not exist": sorted(listed - accepted),
        }
        if any(problems.values()):
            wrong[" ".join(path)] = problems
    assert wrong == {}


# -- (f) metrics ------------------------------------------------------------------------------


def test_every_metric_of_the_metrics_endpoint_is_documented_and_every_documented_one_exists() -> (
    None
):
    from tether.api.metrics import _Scrape

    # One scrape's metric families: this process's and those counted at scrape time.
    exported = {metric.name for metric in _Scrape({}, 0, {}, []).collect()}
    row = next(line for line in section(6).splitlines() if line.startswith("| `GET /metrics`"))
    # A counter's samples end in _total; its family's name does not.
    listed = {name.removesuffix("_total") for name in re.findall(r"`(tether_\w+)", row)}
    assert listed == exported
