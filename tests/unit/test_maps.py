"""The maps a newcomer reads are kept complete by the code: docs/architecture.md names every
module of ``src/tether`` and tests/README.md every test file and support module, each once
and under the heading of its own package or tier, and neither names a file that does not
exist. A failure says which rows to add, move or remove."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tether"
TESTS = ROOT / "tests"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TESTS_README = TESTS / "README.md"
MIGRATIONS = Path("store", "migrations", "versions")  # named by store/migrate.py, not one by one
LONGEST_CELL = 300  # a map's cell is a line a person reads, not a paragraph

_FENCE = re.compile(r"^(```|~~~)")
_SUBHEADING = re.compile(r"^### (.*)$")
_CODE = re.compile(r"`([^`]+)`")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_RULE = re.compile(r"\|(\s*:?-+:?\s*\|)+")
_TEST_NAME = re.compile(r"(?:[a-z]+/)?test_\w+")


@dataclass(frozen=True)
class Row:
    """A table row of a map: the ``### `` heading it is under, its cells, its line."""

    heading: str
    cells: tuple[str, ...]
    line: int

    @property
    def name(self) -> str:
        found: list[str] = _CODE.findall(self.cells[0])
        assert found, f"line {self.line}: a row without a `path` in its first cell: {self.cells}"
        return found[0]


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in _CELL_SPLIT.split(line.strip().strip("|")))


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """A Markdown file's lines outside fenced code, numbered from 1."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def rows(path: Path, *header: str) -> list[Row]:
    """The rows of every table of ``path`` headed ``header``, each with its ``###`` heading."""
    lines = list(_lines(path))
    found: list[Row] = []
    heading = ""
    i = 0
    while i < len(lines):
        line = lines[i][1]
        match = _SUBHEADING.match(line)
        if match:
            heading = match.group(1)
        elif line.startswith("|") and i + 1 < len(lines) and _RULE.fullmatch(lines[i + 1][1]):
            cells = _cells(line)
            i += 2
            while i < len(lines) and lines[i][1].startswith("|"):
                if cells == header:
                    found.append(Row(heading, _cells(lines[i][1]), lines[i][0]))
                i += 1
            continue
        i += 1
    return found


def folder_of(heading: str) -> str:
    """The folder a ``###`` heading is about: its first `code` that ends in ``/``, else the
    top level (``""``)."""
    return next((code for code in _CODE.findall(heading) if code.endswith("/")), "")


def headings(path: Path) -> list[str]:
    return [str(m.group(1)) for _, line in _lines(path) if (m := _SUBHEADING.match(line))]


def problems(expected: set[str], named: list[str]) -> dict[str, list[str]]:
    counted = Counter(named)
    return {
        "missing": sorted(expected - set(counted)),
        "absent": sorted(set(counted) - expected),
        "twice": sorted(name for name, count in counted.items() if count > 1),
    }


def report(document: str, found: dict[str, list[str]], add: str) -> str:
    lines = [f"{document} is out of date:"]
    if found["missing"]:
        lines.append(f"  add {add} for: " + ", ".join(found["missing"]))
    if found["absent"]:
        lines.append("  remove the rows of what does not exist: " + ", ".join(found["absent"]))
    if found["twice"]:
        lines.append("  keep one row each for: " + ", ".join(found["twice"]))
    return "\n".join(lines)


def misplaced(listed: Iterable[Row], folders: set[str]) -> list[str]:
    """Rows under the heading of another folder than their own (the longest named one that
    holds them)."""
    wrong: list[str] = []
    for row in listed:
        owner = max((f for f in folders if row.name.startswith(f)), key=len, default="")
        if folder_of(row.heading) != owner:
            where = f"`{owner}`" if owner else "the top level"
            wrong.append(f"`{row.name}` (line {row.line}) belongs under the heading of {where}")
    return wrong


def long_cells(path: Path) -> list[str]:
    """The cells of ``path``'s tables over ``LONGEST_CELL`` characters."""
    return [
        f"line {number}: a cell of {len(cell)} characters: {cell[:60]}..."
        for number, line in _lines(path)
        if line.startswith("|")
        for cell in _cells(line)
        if len(cell) > LONGEST_CELL
    ]


# -- docs/architecture.md ----------------------------------------------------------------------


def modules() -> set[str]:
    """Every module of ``src/tether`` by its path under it, package ``__init__``s (named by
    their package) and the migrations aside."""
    return {
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if path.name != "__init__.py" and not path.relative_to(SRC).is_relative_to(MIGRATIONS)
    }


def packages() -> set[str]:
    """Every package under ``src/tether`` (a folder with an ``__init__.py``), as ``path/``."""
    return {
        f"{path.parent.relative_to(SRC).as_posix()}/"
        for path in SRC.rglob("__init__.py")
        if path.parent != SRC
    }


def module_rows() -> list[Row]:
    return rows(ARCHITECTURE, "module", "job")


def test_the_module_map_names_every_module_once_and_none_that_is_absent() -> None:
    found = problems(modules(), [row.name for row in module_rows()])
    add = "a row `| `path` | its one job |` under its package's heading"
    assert not any(found.values()), report("docs/architecture.md's module map", found, add)


def test_the_module_map_has_a_heading_for_every_package_and_none_that_is_absent() -> None:
    named = [folder for heading in headings(ARCHITECTURE) if (folder := folder_of(heading))]
    found = problems(packages(), named)
    add = "a heading `### `package/``, a line on its job and its table of modules,"
    assert not any(found.values()), report("docs/architecture.md's module map", found, add)


def test_each_module_is_under_its_own_package() -> None:
    wrong = misplaced(module_rows(), packages())
    assert wrong == [], "docs/architecture.md's module map:\n  " + "\n  ".join(wrong)


def test_every_module_has_a_job() -> None:
    blank = [row.name for row in module_rows() if len(row.cells) < 2 or not row.cells[1]]
    assert blank == [], f"docs/architecture.md: say in a line what each of these does: {blank}"


def test_the_architectures_tables_have_short_cells() -> None:
    wrong = long_cells(ARCHITECTURE)
    assert wrong == [], "docs/architecture.md: split these into rows:\n  " + "\n  ".join(wrong)


# -- tests/README.md ---------------------------------------------------------------------------


def tier_files() -> set[str]:
    """Every test file of every tier, by its path under ``tests/``."""
    return {path.relative_to(TESTS).as_posix() for path in TESTS.glob("*/**/test_*.py")}


def support_modules() -> set[str]:
    return {path.relative_to(TESTS).as_posix() for path in (TESTS / "support").glob("*.py")}


def tier_rows() -> list[Row]:
    return rows(TESTS_README, "test file", "what it proves")


def test_the_tests_readme_names_every_test_file_once_and_none_that_is_absent() -> None:
    found = problems(tier_files(), [row.name for row in tier_rows()])
    add = "a row `| `tier/test_x.py` | what it proves |` under its tier's heading"
    assert not any(found.values()), report("tests/README.md", found, add)


def test_the_tests_readme_names_every_support_module_once_and_none_that_is_absent() -> None:
    listed = rows(TESTS_README, "module", "what it provides")
    found = problems(support_modules(), [row.name for row in listed])
    add = "a row `| `support/x.py` | what it provides |` to the support table"
    assert not any(found.values()), report("tests/README.md", found, add)


def test_each_test_file_is_under_its_own_tier() -> None:
    tiers = {f"{path.name}/" for path in TESTS.iterdir() if path.is_dir()}
    wrong = misplaced(tier_rows(), tiers)
    assert wrong == [], "tests/README.md:\n  " + "\n  ".join(wrong)


def test_every_test_file_says_what_it_proves() -> None:
    blank = [row.name for row in tier_rows() if len(row.cells) < 2 or not row.cells[1]]
    assert blank == [], f"tests/README.md: say in a line what each of these proves: {blank}"


def test_the_rooms_table_names_only_tests_that_exist() -> None:
    stems = {Path(name).stem for name in tier_files()}
    named = {
        Path(code).stem
        for _, line in _lines(TESTS_README)
        if line.startswith("|")
        for code in _CODE.findall(line)
        if _TEST_NAME.fullmatch(code)
    }
    assert sorted(named - stems) == [], "tests/README.md names tests that do not exist"


def test_the_tests_readmes_tables_have_short_cells() -> None:
    wrong = long_cells(TESTS_README)
    assert wrong == [], "tests/README.md: split these into rows:\n  " + "\n  ".join(wrong)


_CITED_MODULE = re.compile(
    r"`((?:_runtime|store|engine|approvals|api|cli|tools|models|telemetry|mcp|demo)/[\w/]+\.py)`"
)


def test_every_module_the_docs_cite_by_path_exists() -> None:
    """A path like ``_runtime/step/loop.py`` in a map or a guide names a module that exists:
    modules move, and a guide that points at a file gone sends a reader nowhere."""
    guides = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", TESTS_README]
    gone = [
        f"{guide.relative_to(ROOT)}:{number}: {cited}"
        for guide in guides
        for number, line in _lines(guide)
        for cited in _CITED_MODULE.findall(line)
        if not (SRC / cited).exists()
    ]
    assert gone == [], "these cite modules that do not exist:\n  " + "\n  ".join(gone)
