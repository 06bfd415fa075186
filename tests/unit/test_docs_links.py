"""The README and the docs are maps a newcomer follows: every link between them lands on a
file and a heading that exist, and the README's environment table names exactly the
variables of the reference's, so neither drifts from the other."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "README.md"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_VARIABLE_ROW = re.compile(r"^\| `((?:TETHER|OTEL|OPENAI|ANTHROPIC)_[A-Z0-9_]+)` \|", re.MULTILINE)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (letters, digits,
    spaces, ``-`` and ``_`` kept), spaces as hyphens."""
    text = heading.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, outside fenced code; a repeated heading's
    anchor gets ``-1``, ``-2``, ... as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The relative links of a Markdown file, outside fenced code."""
    out: list[str] = []
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.extend(m.group(1) for m in _LINK.finditer(line))
    return [link for link in out if not re.match(r"[a-z]+:", link)]


def test_the_slug_is_githubs() -> None:
    assert (
        slug("17. Flow control: priorities, start times")
        == "17-flow-control-priorities-start-times"
    )
    assert slug("The model rate limit (`TETHER_MODEL_RPM`, `TETHER_MODEL_TPM`)") == (
        "the-model-rate-limit-tether_model_rpm-tether_model_tpm"
    )


def test_every_relative_link_lands_on_a_file_and_a_heading_that_exist() -> None:
    broken = []
    for source in MAPS:
        for link in links(source):
            target, _, anchor = link.partition("#")
            path = (source.parent / target).resolve() if target else source
            if not path.exists():
                broken.append(f"{source.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{source.relative_to(ROOT)}: {link} (no such heading)")
    assert broken == []


def test_the_readme_names_every_variable_of_the_reference_and_no_other() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    reference = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    environment = reference[reference.index("## 5. Environment") : reference.index("## 6. ")]
    assert set(_VARIABLE_ROW.findall(readme)) == set(_VARIABLE_ROW.findall(environment))
