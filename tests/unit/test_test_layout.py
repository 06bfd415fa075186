"""No test module imports another test module: what tests share lives in tests/support
(on pytest's path, type-checked), and fixtures shared by a folder in its conftest.py, so
a test module can be moved, renamed or run alone without breaking another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "support"}


def _test_modules() -> list[Path]:
    return sorted(
        p
        for p in TESTS.rglob("*.py")
        if "support" not in p.relative_to(TESTS).parts and p.name != "conftest.py"
    )


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """Each module an import statement names, by its line (relative imports with dots)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def _names_a_test_module(module: str, test_names: set[str]) -> bool:
    if module.startswith("."):
        return True  # tests are not packages: a relative import reaches another test file
    top = module.split(".")[0]
    return top == "tests" or top in TIERS or top in test_names


def test_no_test_module_imports_another() -> None:
    modules = _test_modules()
    test_names = {p.stem for p in modules}
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in modules
        for line, module in _imported(ast.parse(path.read_text(), str(path)))
        if _names_a_test_module(module, test_names)
    ]
    assert not offenders, "move what is shared to tests/support:\n" + "\n".join(offenders)


def test_the_check_sees_every_kind_of_import_of_a_test_module() -> None:
    """The check would fail on each way a test module can reach another."""
    test_names = {"test_api", "test_store"}
    for source in (
        "from test_api import DANA",
        "import test_store",
        "from tests.integration.test_api import serving",
        "from integration.test_api import serving",
        "from . import test_api",
        "from .test_api import DANA",
    ):
        (_, module), *_ = _imported(ast.parse(source))
        assert _names_a_test_module(module, test_names), source
    for source in ("import json_api", "from store_runs import new_run", "import pytest"):
        (_, module), *_ = _imported(ast.parse(source))
        assert not _names_a_test_module(module, test_names), source
